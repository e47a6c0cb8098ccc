package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/config/configtest"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// TestLargestConfigReloads (issue #63 row 3): the real agent, with deploy/base's GOMEMLIMIT, reads
// the largest config file it accepts (1 MiB: configtest.LargestEntries nodeOverrides entries) at
// start and reloads it six times. At main 3f85643 one load allocated 361 MB (a replacer built per
// option key) and took 2.2 s of CPU; the agent's peak RSS was 91 MB at start, 137 MB after one
// reload, 174 MB after six, over the DaemonSet's 128Mi limit. Now the peak stays under the limit
// with a quarter to spare; the CPU of each reload and the peaks are printed.
func TestLargestConfigReloads(t *testing.T) {
	c := sharedCluster(t, "nftables")
	agentC, _ := deployBase(t)
	var env []string
	for _, e := range agentC.Env {
		if e.Name == "GOMEMLIMIT" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	limit := agentC.Resources.Limits.Memory().Value()
	largest := string(configtest.Largest())
	if len(largest)+len("# reload 9\n") > config.MaxFileSize {
		t.Fatalf("the largest file leaves no room for the reloads' comment")
	}
	n := startNode(t, c, "nftables", nodeOptions{config: largest, env: env})
	pid := n.agent.PID()
	_, startPeak := procMemory(t, pid)
	cpu0 := procCPU(t, pid)
	var peaks []string
	var cpu []time.Duration
	for i := 1; i <= 6; i++ {
		n.writeConfig(largest + "# reload " + strconv.Itoa(i) + "\n")
		agenttest.Eventually(t, 60*time.Second, func() error {
			if v, _ := n.metrics().Value("nnm_config_reloads_total", "result", "success"); v < float64(i) {
				return fmt.Errorf("nnm_config_reloads_total{result=success} = %v, want %d", v, i)
			}
			return nil
		})
		cpu1 := procCPU(t, pid)
		cpu = append(cpu, cpu1-cpu0)
		cpu0 = cpu1
		_, peak := procMemory(t, pid)
		peaks = append(peaks, peak)
	}
	if v, _ := n.metrics().Value("nnm_config_reloads_total", "result", "error"); v != 0 {
		t.Errorf("nnm_config_reloads_total{result=error} = %v", v)
	}
	rss, peak := procMemory(t, pid)
	t.Logf("largest file (%d bytes, %d entries): peak RSS %s at start; after each reload %s; now %s; CPU per reload (until the success was counted) %v",
		len(largest), configtest.LargestEntries, startPeak, strings.Join(peaks, ", "), rss, cpu)
	kb, err := strconv.ParseInt(strings.TrimSuffix(peak, " kB"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if spare := limit - kb<<10; spare < limit/4 {
		t.Errorf("peak RSS %s through six reloads leaves %s of the DaemonSet's %s limit, want at least a quarter",
			peak, resource.NewQuantity(spare, resource.BinarySI), agentC.Resources.Limits.Memory())
	}
}

// procCPU is the CPU time a process has used (user and system, /proc/PID/stat).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces) start after its closing parenthesis.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// deployBase is what the tests of the agent as deployed read of deploy/base: the DaemonSet's agent container and the
// config file of its ConfigMap.
func deployBase(t *testing.T) (corev1.Container, map[string]any) {
	t.Helper()
	root, err := agenttest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	var cfg map[string]any
	// config.yaml is the file kustomization.yaml's configMapGenerator puts in the ConfigMap.
	for file, into := range map[string]any{"daemonset.yaml": &ds, "config.yaml": &cfg} {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "base", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, into); err != nil {
			t.Fatalf("deploy/base/%s: %v", file, err)
		}
	}
	return ds.Spec.Template.Spec.Containers[0], cfg
}

// procMemory is a process's resident memory now and at its peak (VmRSS, VmHWM of /proc/PID/status).
func procMemory(t *testing.T, pid int) (rss, peak string) {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rss = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			peak = strings.TrimSpace(v)
		}
	}
	return rss, peak
}
