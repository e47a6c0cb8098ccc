// Package felixtest runs the real Calico Felix (built by hack/felix/build.sh from a pinned Calico
// commit) in a "node" network namespace against the local API server (internal/testing/controlplane), with
// the Kubernetes datastore (KDD), for the Felix lane (e2e/felix, `make test-felix`):
//
//	b := felixtest.Load(t)                                      // the build, from $NNM_FELIX_ENV
//	felixtest.InstallCRDs(t, cp.AdminRESTConfig(), b)           // Calico's CRDs, ClusterInformation
//	f := felixtest.StartT(t, b, felixtest.Options{Netns: ns, Kubeconfig: kc, NodeName: "n1", Mode: felixtest.IptablesNFT})
//	f.WaitProgrammedT(t, 90*time.Second)                        // its jumps (or tables) are in the kernel
//	n := f.Count(felixtest.OutOfSync)                           // its "Detected out-of-sync …" warnings
//
// No kubelet, calico-node or operator runs: Felix alone needs Calico's CRDs, a ClusterInformation
// "default" with datastoreReady, and its Node (kubeproxytest.CreateNode). What it programs stays in
// its namespace; it leaves it there when it stops (the namespace goes with the test).
package felixtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// EnvFile names the variable holding the path of felix.env (what hack/felix/build.sh wrote). It is
// the lane's gate: `make test-felix` sets it; without it the lane's tests skip, since the lane is
// opt-in (it needs Calico's source and a 5-minute build); with it, a missing or broken build fails.
const EnvFile = "NNM_FELIX_ENV"

// Build is one Felix build (felix.env).
type Build struct {
	Bin           string // calico-felix
	CRDs          string // directory of Calico's CRD manifests
	CalicoCommit  string
	LibbpfVersion string
	// NFTables: this Felix has an nftables data plane (FELIX_NFTABLESMODE).
	NFTables bool
}

// Load returns the build $NNM_FELIX_ENV names. Without the variable the test skips (the lane is
// opt-in); with it, anything missing fails the test.
func Load(tb testing.TB) *Build {
	tb.Helper()
	path := os.Getenv(EnvFile)
	if path == "" {
		tb.Skipf("the Felix lane is opt-in: run `make test-felix` (hack/felix/build.sh builds Felix and sets %s)", EnvFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%s=%s: %v; run hack/felix/build.sh", EnvFile, path, err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	b := &Build{
		Bin: env["NNM_FELIX_BIN"], CRDs: env["NNM_FELIX_CRDS"],
		CalicoCommit: env["NNM_FELIX_CALICO_COMMIT"], LibbpfVersion: env["NNM_FELIX_LIBBPF_VERSION"],
		NFTables: env["NNM_FELIX_NFTABLES"] == "true",
	}
	if st, err := os.Stat(b.Bin); err != nil || st.Mode()&0o111 == 0 {
		tb.Fatalf("NNM_FELIX_BIN from %s: %q is missing or not executable (%v); run hack/felix/build.sh again", path, b.Bin, err)
	}
	if _, err := os.Stat(b.CRDs); err != nil {
		tb.Fatalf("NNM_FELIX_CRDS from %s: %v; run hack/felix/build.sh again", path, err)
	}
	return b
}

// InstallCRDs applies Calico's CRDs and, once the API server serves them, the ClusterInformation
// "default" with datastoreReady: true, without which Felix waits.
func InstallCRDs(tb testing.TB, cfg *rest.Config, b *Build) {
	tb.Helper()
	ctx := tb.Context()
	files, err := filepath.Glob(filepath.Join(b.CRDs, "*.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no CRD manifests in %s (%v)", b.CRDs, err)
	}
	a, err := agenttest.NewApplier(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &u.Object); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		if err := a.Apply(ctx, u, false); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
	}
	ci := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crd.projectcalico.org/v1", "kind": "ClusterInformation",
		"metadata": map[string]any{"name": "default"},
		"spec":     map[string]any{"datastoreReady": true},
	}}
	// A fresh Applier per try: discovery is cached, and the new kinds appear once established.
	if err := agenttest.Poll(ctx, 60*time.Second, 500*time.Millisecond, func() error {
		a, err := agenttest.NewApplier(cfg)
		if err != nil {
			return err
		}
		return a.Apply(ctx, ci, false)
	}); err != nil {
		tb.Fatalf("ClusterInformation default: %v", err)
	}
}

// Mode is Felix's data plane.
type Mode string

const (
	// IptablesNFT is Felix's iptables data plane with the nft variant (FELIX_IPTABLESBACKEND=NFT).
	IptablesNFT Mode = "iptables-nft"
	// NFTables is Felix's nftables data plane (FELIX_NFTABLESMODE=Enabled): tables ip/ip6 calico.
	NFTables Mode = "nftables"
)

// OutOfSync is the start of the warnings Felix logs when it finds its rules changed behind its back:
// "Detected out-of-sync inserts" (a jump it inserts into a built-in chain is no longer where it put
// it: the tug-of-war with another agent that wants its jump first), and "… Calico chain".
const OutOfSync = "Detected out-of-sync"

// OutOfSyncInserts is the warning of the tug-of-war itself.
const OutOfSyncInserts = "Detected out-of-sync inserts"

// Options says how to run Felix.
type Options struct {
	Netns      string // the node namespace (under /run/netns). Required.
	Kubeconfig string // works from inside Netns. Required.
	NodeName   string // FELIX_FELIXHOSTNAME; the Node must exist. Required.
	Mode       Mode   // required
	// Env is added last (later entries win), e.g. FELIX_IPTABLESREFRESHINTERVAL=10.
	Env []string
	// LogFile receives stdout and stderr; StartT defaults it into tb.TempDir().
	LogFile string
}

// Felix is one running calico-felix.
type Felix struct {
	*netns.Process
	opts Options
}

// Env is Felix's environment for opts: KDD against the test's API server, logs to stdout only, no
// usage reporting, no XDP or BPF, and the data plane of opts.Mode.
func Env(opts Options) []string {
	env := []string{
		"FELIX_DATASTORETYPE=kubernetes",
		"KUBECONFIG=" + opts.Kubeconfig,
		"FELIX_FELIXHOSTNAME=" + opts.NodeName,
		"FELIX_LOGSEVERITYSCREEN=info",
		"FELIX_LOGSEVERITYSYS=none",
		"FELIX_LOGFILEPATH=none",
		"FELIX_USAGEREPORTINGENABLED=false",
		"FELIX_XDPENABLED=false",
		"FELIX_BPFENABLED=false",
		"FELIX_IPV6SUPPORT=true",
		"FELIX_HEALTHENABLED=false",
	}
	switch opts.Mode {
	case IptablesNFT:
		env = append(env, "FELIX_IPTABLESBACKEND=NFT", "FELIX_NFTABLESMODE=Disabled")
	case NFTables:
		env = append(env, "FELIX_NFTABLESMODE=Enabled")
	}
	return append(env, opts.Env...)
}

// Start starts Felix in opts.Netns and returns without waiting (see WaitProgrammed).
func Start(b *Build, opts Options) (*Felix, error) {
	if opts.Netns == "" || opts.Kubeconfig == "" || opts.NodeName == "" || opts.Mode == "" {
		return nil, errors.New("felixtest: Netns, Kubeconfig, NodeName and Mode are required")
	}
	if opts.Mode == NFTables && !b.NFTables {
		return nil, fmt.Errorf("felixtest: Calico %s has no nftables data plane", b.CalicoCommit)
	}
	proc, err := netns.StartProcess(opts.Netns, "calico-felix", opts.LogFile, nil, Env(opts), b.Bin)
	if err != nil {
		return nil, err
	}
	return &Felix{Process: proc, opts: opts}, nil
}

// Stop sends SIGTERM and waits up to grace, then kills Felix (its process group: `ip netns exec`
// execs it, so the group is Felix's own).
func (f *Felix) Stop(grace time.Duration) { _ = f.Signal(syscall.SIGTERM, grace) }

// Matches returns the log lines that contain s, in order.
func (f *Felix) Matches(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(f.Logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// Count returns how many log lines contain s.
func (f *Felix) Count(s string) int { return len(f.Matches(s)) }

// Programmed reports nil once Felix's rules are in the kernel for both families: its cali-INPUT jump
// in filter INPUT (iptables-nft), or its calico tables (nftables).
func (f *Felix) Programmed(ctx context.Context) error {
	if err := f.Exited(); err != nil {
		return agenttest.Permanent(fmt.Errorf("calico-felix exited: %w", err))
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		switch f.opts.Mode {
		case IptablesNFT:
			out, err := agenttest.IptablesSave(ctx, f.opts.Netns, "nft", fam, "filter")
			if err != nil {
				return err
			}
			if len(agenttest.Lines(out, "-A INPUT ", "-j cali-INPUT")) == 0 {
				return fmt.Errorf("%s: no cali-INPUT jump in filter INPUT yet", fam)
			}
		case NFTables:
			nf := agenttest.NftFamily(fam)
			out, err := agenttest.NftListTable(ctx, f.opts.Netns, nf, "calico")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "hook input") {
				return fmt.Errorf("no table %s calico with an input hook yet", nf)
			}
		}
	}
	return nil
}

// StartT starts Felix for a test, stops it when the test ends and prints its log tail on failure.
func StartT(tb testing.TB, b *Build, opts Options) *Felix {
	tb.Helper()
	if opts.LogFile == "" {
		opts.LogFile = filepath.Join(tb.TempDir(), "felix.log")
	}
	f, err := Start(b, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		f.Stop(10 * time.Second)
		if tb.Failed() {
			tb.Logf("felix log (%s), last 40 lines:\n%s", f.LogPath(), f.LogTail(40))
		}
	})
	return f
}

// WaitProgrammedT waits until Programmed holds and fails the test with the log tail otherwise.
func (f *Felix) WaitProgrammedT(tb testing.TB, timeout time.Duration) time.Duration {
	tb.Helper()
	start := time.Now()
	if err := agenttest.Poll(tb.Context(), timeout, 500*time.Millisecond, func() error { return f.Programmed(tb.Context()) }); err != nil {
		tb.Fatalf("Felix (%s) did not program its rules: %v\nlog tail:\n%s", f.opts.Mode, err, f.LogTail(40))
	}
	return time.Since(start)
}

// Duration parses a duration variable (Go syntax, "10m"), def when unset.
func Duration(tb testing.TB, name string, def time.Duration) time.Duration {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		if n, err2 := strconv.Atoi(v); err2 == nil {
			return time.Duration(n) * time.Second
		}
		tb.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}
