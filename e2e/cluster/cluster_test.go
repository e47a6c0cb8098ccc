package cluster

// The cluster itself: control plane on the host side, two qemu nodes on a bridge, kubectl.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// The address plan. The bridge lives in the control plane's network namespace, which holds the
// apiserver's address on it; the nodes' default route points there.
const (
	bridge      = "nnmbr0"
	gatewayIP   = "192.168.100.1"
	bridgeBits  = "/24"
	clusterCIDR = "10.244.0.0/16"
	shellPort   = 2222 // hack/cluster/node.sh's command shell
)

type nodeSpec struct {
	name, ip, podCIDR, mac string
}

var nodeSpecs = []nodeSpec{
	{"node-a", "192.168.100.11", "10.244.1.0/24", "52:54:00:4e:4e:0a"},
	{"node-b", "192.168.100.12", "10.244.2.0/24", "52:54:00:4e:4e:0b"},
}

// guestModules are loaded by the initramfs; the kernel loads anything else on demand.
var guestModules = []string{"overlay", "br_netfilter", "bridge", "veth", "nf_conntrack", "ip_vs", "ip_vs_rr",
	"ip_vs_wrr", "ip_vs_sh", "ip_set", "xt_set", "nf_tables", "nft_compat", "xt_conntrack", "xt_comment",
	"xt_mark", "xt_addrtype", "xt_MASQUERADE", "iptable_nat", "iptable_filter", "iptable_mangle",
	"nft_chain_nat", "nft_ct", "nft_nat", "nft_masq"}

// Per guest: TCG is slow, memory is what the two nodes' containerd (images unpacked on tmpfs),
// kubelet, kube-proxy and the Pods need.
const (
	guestMemory = "1536"
	guestCPUs   = "2"
)

type env map[string]string

func readEnv(t *testing.T, path string, keys ...string) env {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		netns.Unavailable(t, "%v: run `make test-cluster`, which prepares it", err)
	}
	e := env{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			e[k] = v
		}
	}
	for _, k := range keys {
		if e[k] == "" {
			netns.Unavailable(t, "%s lacks %s: run `make test-cluster` again", path, k)
		}
	}
	return e
}

// prerequisites is what the host side needs: root, the VM lane's kernel and initramfs
// (hack/vm/prepare.sh), the binaries and the images (hack/cluster/images.sh).
type prerequisites struct {
	root, bin string
	vm        env
	images    env
	imagesDir string
}

// laneEnv gates the lane: `make test-cluster` prepares it and sets it; `make test` (./...) skips it,
// since one run takes longer than all of `make test` may.
const laneEnv = "NNM_CLUSTER"

func require(t *testing.T) prerequisites {
	t.Helper()
	if os.Getenv(laneEnv) != "1" {
		t.Skipf("the cluster lane is opt-in: make test-cluster (sets %s=1)", laneEnv)
	}
	netns.RequireRoot(t)
	root, err := agenttest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := prerequisites{root: root, bin: os.Getenv(controlplane.BinDirEnv)}
	if p.bin == "" {
		p.bin = filepath.Join(root, "bin")
	}
	out, err := exec.Command("bash", filepath.Join(root, "hack/vm/prepare.sh"), "--env").Output()
	if err != nil {
		t.Fatalf("hack/vm/prepare.sh --env: %v", err)
	}
	p.vm = readEnv(t, strings.TrimSpace(string(out)), "NNM_VM_KERNEL", "NNM_VM_INITRD", "NNM_VM_MODULES", "NNM_VM_QEMU")
	p.imagesDir = filepath.Join(p.bin, "cluster-images")
	p.images = readEnv(t, filepath.Join(p.imagesDir, "images.env"), "NNM_CLUSTER_PAUSE_IMAGE", "NNM_CLUSTER_WORKLOAD_IMAGE")
	for _, b := range []string{"kubelet", "kubectl", "kube-proxy", "kube-controller-manager", "kube-scheduler", "registry", "cosign", "helm"} {
		if st, err := os.Stat(filepath.Join(p.bin, b)); err != nil || st.Mode()&0o111 == 0 {
			netns.Unavailable(t, "%s/%s missing: run `make test-cluster` (hack/cluster/build.sh, hack/build-release-tools.sh)", p.bin, b)
		}
	}
	for _, f := range []string{"pause.tar", "workload.tar", "sampler"} {
		if _, err := os.Stat(filepath.Join(p.imagesDir, f)); err != nil {
			netns.Unavailable(t, "%v: run `make test-cluster` (hack/cluster/images.sh)", err)
		}
	}
	return p
}

// Cluster is one booted cluster.
type Cluster struct {
	t      *testing.T
	p      prerequisites
	mode   string // kube-proxy's
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	nodes  []*Node
	// kubeconfig is the admin's, usable from this (the root) namespace.
	kubeconfig string
	// registry is the OCI registry the kubelets pull the agent from (release_test.go); helm: this
	// mode installs with Helm, the other with kustomize; rollouts: the sampled ones, for the report.
	registry *laneRegistry
	helm     bool
	rollouts []rollout
}

// Node is one qemu guest.
type Node struct {
	nodeSpec
	dir  string // shared writable with the guest (9p tag nnmshare): node.env, the logs
	cmd  *exec.Cmd
	done chan error
}

// startCluster starts the control plane with its controllers, the bridge and both nodes, and waits
// until both Nodes are Ready. Everything is removed when t ends.
func startCluster(t *testing.T, p prerequisites, mode string) *Cluster {
	start := time.Now()
	cp := controlplane.StartT(t, controlplane.Options{
		Controllers: true,
		// The default/kubernetes Service's endpoint is the address the nodes reach; the kubelets
		// (kubectl exec, logs) are dialled by their InternalIP: no DNS knows the nodes' names.
		ExtraAPIServerArgs: []string{"--advertise-address=" + gatewayIP, "--kubelet-preferred-address-types=InternalIP"},
	})
	c := &Cluster{t: t, p: p, mode: mode, cp: cp, client: cp.AdminClient(), kubeconfig: cp.AdminKubeconfig(),
		registry: newLaneRegistry(t), helm: mode == helmMode()}
	t.Logf("control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) up after %v", time.Since(start).Round(100*time.Millisecond))
	ns := cp.Netns()
	mustNS(t, ns, "ip", "link", "add", bridge, "type", "bridge")
	mustNS(t, ns, "ip", "addr", "add", gatewayIP+bridgeBits, "dev", bridge)
	mustNS(t, ns, "ip", "link", "set", bridge, "up")
	c.registry.start(t, c)

	data, err := os.ReadFile(cp.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	nodeKubeconfig := strings.ReplaceAll(string(data), cp.Server(), "https://"+gatewayIP+":6443")
	var routes []string
	for _, s := range nodeSpecs {
		routes = append(routes, s.podCIDR+"@"+s.ip)
	}
	for i, s := range nodeSpecs {
		n := &Node{nodeSpec: s, dir: t.TempDir(), done: make(chan error, 1)}
		var own []string
		for j, r := range routes {
			if j != i {
				own = append(own, r)
			}
		}
		nodeEnv := map[string]string{
			"PATH":      "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"NODE_NAME": s.name, "NODE_IP": s.ip, "GATEWAY": gatewayIP, "POD_CIDR": s.podCIDR,
			"CLUSTER_CIDR": clusterCIDR, "ROUTES": strings.Join(own, " "), "PROXY_MODE": mode, "BIN": p.bin,
			"IMAGES":      filepath.Join(p.imagesDir, "pause.tar") + " " + filepath.Join(p.imagesDir, "workload.tar"),
			"PAUSE_IMAGE": p.images["NNM_CLUSTER_PAUSE_IMAGE"],
			// The agent's image is pulled from the lane's registry, whose CA containerd trusts.
			"REGISTRY": c.registry.addr, "REGISTRY_CA": c.registry.caFile,
		}
		var b strings.Builder
		for k, v := range nodeEnv {
			fmt.Fprintf(&b, "export %s=%s\n", k, strconv.Quote(v))
		}
		if err := os.WriteFile(filepath.Join(n.dir, "node.env"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "kubeconfig"), []byte(nodeKubeconfig), 0o600); err != nil {
			t.Fatal(err)
		}
		// The Node exists before its kubelet registers, with the pod CIDR its CNI config uses.
		if _, err := c.client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: s.name},
			Spec:       corev1.NodeSpec{PodCIDR: s.podCIDR, PodCIDRs: []string{s.podCIDR}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.boot(n)
		c.nodes = append(c.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if t.Failed() {
				for _, f := range []string{"node.log", "containerd.log", "kubelet.log", "kube-proxy.log", "console.log"} {
					t.Logf("%s %s (last lines):\n%s", n.name, f, tail(filepath.Join(n.dir, f), 25))
				}
			}
			_ = n.cmd.Process.Kill()
			<-n.done
		}
	})
	took := agenttest.Eventually(t, 10*time.Minute, func() error {
		for _, n := range c.nodes {
			select {
			case err := <-n.done:
				n.done <- err
				t.Fatalf("%s: qemu exited: %v; console:\n%s", n.name, err, tail(filepath.Join(n.dir, "console.log"), 20))
			default:
			}
			node, err := c.client.CoreV1().Nodes().Get(t.Context(), n.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(node) {
				return fmt.Errorf("%s is not Ready: %v", n.name, node.Status.Conditions)
			}
		}
		return nil
	})
	t.Logf("both nodes Ready %v after qemu started (kube-proxy %s, qemu TCG single-threaded, %s vCPUs, %s MiB each)", took.Round(time.Second), mode, guestCPUs, guestMemory)
	return c
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// boot starts n's qemu in the control plane's namespace, on a tap device of the bridge.
func (c *Cluster) boot(n *Node) {
	t := c.t
	ns := c.cp.Netns()
	tap := "tap-" + n.name
	mustNS(t, ns, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	mustNS(t, ns, "ip", "link", "set", tap, "master", bridge, "up")
	args := []string{
		// One host thread per guest (single-threaded TCG): two guests of multi-threaded TCG put four
		// vCPU threads on this 2-core machine, and one run saw a guest's both vCPUs in soft lockup
		// ("rcu_preempt kthread starved", the kubelet never posted node status) for 10 min.
		"-accel", "tcg,thread=single",
		"-m", guestMemory, "-smp", guestCPUs, "-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", c.p.vm["NNM_VM_KERNEL"], "-initrd", c.p.vm["NNM_VM_INITRD"],
		// no_timer_check: see e2e/vm (the IO-APIC timer check misses its ticks under emulation).
		"-append", "console=ttyS0 quiet panic=-1 no_timer_check nnm.run=" + filepath.Join(c.p.root, "hack/cluster/node.sh") +
			" nnm.root=switch nnm.modules=" + strings.Join(guestModules, ","),
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
		"-fsdev", "local,id=mods,path=" + c.p.vm["NNM_VM_MODULES"] + ",security_model=none,readonly=on",
		"-device", "virtio-9p-pci,fsdev=mods,mount_tag=nnmmods",
		"-fsdev", "local,id=share,path=" + n.dir + ",security_model=none",
		"-device", "virtio-9p-pci,fsdev=share,mount_tag=nnmshare",
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + n.mac,
	}
	console, err := os.Create(filepath.Join(n.dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	n.cmd = netns.Command(context.Background(), ns, append([]string{c.p.vm["NNM_VM_QEMU"]}, args...)...)
	n.cmd.Stdout, n.cmd.Stderr = console, console
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("start qemu for %s: %v", n.name, err)
	}
	go func() {
		n.done <- n.cmd.Wait()
		console.Close()
	}()
}

func mustNS(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := netns.Exec(context.Background(), ns, args...); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return tailString(string(data), n)
}

// Shell runs script with /bin/sh on the node (hack/cluster/node.sh's command shell) and returns its
// output; a non-zero exit status is an error.
func (n *Node) Shell(ctx context.Context, c *Cluster, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	conn, err := netns.DialContext(netns.Path(c.cp.Netns()), nil)(ctx, "tcp", n.ip+":"+strconv.Itoa(shellPort))
	if err != nil {
		return "", fmt.Errorf("%s shell: %w", n.name, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	const marker = "NNM-SHELL-RC="
	if _, err := io.WriteString(conn, "{\n"+script+"\n} 2>&1; echo "+marker+"$?\n"); err != nil {
		return "", err
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	data, err := io.ReadAll(bufio.NewReader(conn))
	out := string(data)
	i := strings.LastIndex(out, marker)
	if i < 0 {
		return out, fmt.Errorf("%s shell: no exit status (%v): %s", n.name, err, out)
	}
	rc := strings.TrimSpace(out[i+len(marker):])
	out = out[:i]
	if rc != "0" {
		return out, fmt.Errorf("%s shell: %q exited %s: %s", n.name, script, rc, out)
	}
	return out, nil
}

// Kubectl runs bin/kubectl as the admin and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.p.bin, "kubectl"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// node returns the node named name.
func (c *Cluster) node(name string) *Node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

// waitPodsReady waits until every named Pod in namespace is Ready.
func (c *Cluster) waitPodsReady(ns string, timeout time.Duration, names ...string) time.Duration {
	var mu sync.Mutex
	return agenttest.Eventually(c.t, timeout, func() error {
		mu.Lock()
		defer mu.Unlock()
		var errs []error
		for _, name := range names {
			p, err := c.client.CoreV1().Pods(ns).Get(c.t.Context(), name, metav1.GetOptions{})
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !podReady(p) {
				errs = append(errs, fmt.Errorf("pod %s/%s on %s: %s %v", ns, name, p.Spec.NodeName, p.Status.Phase, containerStates(p)))
			}
		}
		return errors.Join(errs...)
	})
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerStates(p *corev1.Pod) []string {
	var s []string
	for _, st := range p.Status.ContainerStatuses {
		switch {
		case st.State.Waiting != nil:
			s = append(s, st.Name+": waiting "+st.State.Waiting.Reason+" "+st.State.Waiting.Message)
		case st.State.Terminated != nil:
			s = append(s, fmt.Sprintf("%s: terminated %s exit %d", st.Name, st.State.Terminated.Reason, st.State.Terminated.ExitCode))
		case st.State.Running != nil:
			s = append(s, fmt.Sprintf("%s: running, ready %v, restarts %d", st.Name, st.Ready, st.RestartCount))
		}
	}
	return s
}
