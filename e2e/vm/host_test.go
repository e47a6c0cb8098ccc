package vm

// The host half of the VM lane: control plane, cluster objects, and the qemu boot that runs the guest
// half (guest_test.go). This lane proves with real IPVS on kernel 6.1 what the fast lane
// (dataplane/externalip_test.go, host kernel) can only emulate: kubernetes#75262 and its fix beside
// kube-proxy's IPVS mode; and it runs the connection-reset reproduction that the host lanes
// (dataplane/reset_test.go, dataplane/kubeproxy_test.go) run beside no, iptables- and nftables-mode
// kube-proxy, beside the IPVS mode. See doc.go.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// guestEnv is set in the guest: the test binary runs there again, with -test.run selecting the guest
// half (guest_test.go).
const guestEnv = "NNM_VM_GUEST"

// The guest's view of the network (qemu user-mode defaults) and of the cluster.
const (
	guestAPIServer = "10.0.2.100:6443" // guestfwd to the host-side apiserver
	nodeName       = "vm-node"
	remoteNodeName = "other-node" // where the endpoints live: the VM node has none
	endpointPort   = 8080
	servicePort    = 80
	svcNamespace   = "default"
)

// plan is the address plan of one family; IPv4 and IPv6 differ only here.
type plan struct {
	family   string // ipv4, ipv6
	nodeIP   string // on eth0 (IPv6: added by the test), the Node's InternalIP
	podCIDR  string // this node's pods
	podGW    string // the node's address towards the pod (pod0)
	podIP    string
	epGW     string // the node's address towards the endpoint (rem0)
	endpoint string // a pod on the other node, reached through the VM (netns "ep")
	prefix   string // of the two links
	lbLocal  string // externalTrafficPolicy: Local, ipMode VIP (default)
	lbProxy  string // ipMode: Proxy, must be left alone
}

var plans = []plan{
	// The pod side is the connection-reset reproduction's (internal/testing/resettest), which the guest extends.
	{"ipv4", "10.0.2.15", resettest.V4.PodCIDR.String(), resettest.V4.PodGW().String(), resettest.V4.PodIP().String(), "10.244.2.1", "10.244.2.2", "/24", "203.0.113.10", "203.0.113.11"},
	{"ipv6", "fd00:10:0:2::15", resettest.V6.PodCIDR.String(), resettest.V6.PodGW().String(), resettest.V6.PodIP().String(), "fd00:10:244:2::1", "fd00:10:244:2::2", "/64", "2001:db8:113::10", "2001:db8:113::11"},
}

// vmTimeout bounds one boot-run-poweroff cycle: 2.5-4 minutes were measured on 2 cores shared with
// other builds; the guest's own waits (kube-proxy, agent readiness) allow for twice as slow. On
// 2026-12-07, with a load average near 30 on the 2 cores, one run had not finished the follow
// subtest after 12 minutes (kube-proxy's first sync 1m12s, the agent ready after 1m7s); the gate
// subtest of v1.37 adds a kube-proxy restart and an agent start.
const vmTimeout = 16 * time.Minute

// vmEnv is what hack/vm/prepare.sh produced (vm.env).
type vmEnv map[string]string

// loadVM reads vm.env, whose path hack/vm/prepare.sh --env prints.
func loadVM(t *testing.T) vmEnv {
	t.Helper()
	root, err := agenttest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(root, "hack/vm/prepare.sh"), "--env").Output()
	if err != nil {
		t.Fatalf("hack/vm/prepare.sh --env: %v", err)
	}
	path := strings.TrimSpace(string(out))
	data, err := os.ReadFile(path)
	if err != nil {
		netns.Unavailable(t, "the VM lane is not prepared (%v): run `make test-vm` or hack/vm/prepare.sh (root on Debian: installs qemu-system-x86, busybox-static, kmod, ipset and fetches the pinned kernel)", err)
	}
	env := vmEnv{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	for _, k := range []string{"NNM_VM_KERNEL", "NNM_VM_INITRD", "NNM_VM_MODULES", "NNM_VM_QEMU", "NNM_VM_BUSYBOX"} {
		if _, err := os.Stat(env[k]); err != nil {
			netns.Unavailable(t, "%s from %s: %v; run hack/vm/prepare.sh again", k, path, err)
		}
	}
	return env
}

// guestModules are loaded by the initramfs before the test starts; anything else the guest needs is
// loaded by the kernel on demand (the initramfs serves modprobe from the shared modules tree).
var guestModules = []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack", "dummy", "veth",
	"ip_set", "xt_set", "nf_tables", "nft_compat", "xt_conntrack", "xt_comment", "xt_mark", "xt_addrtype",
	"xt_MASQUERADE", "iptable_nat", "iptable_filter", "iptable_mangle", "nft_chain_nat", "nft_ct", "nft_nat",
	"nft_masq"}

var exitRE = regexp.MustCompile(`(?m)^NNM-VM-EXIT=(\d+)`)

// runGuest boots the VM, runs the guest half of this test binary (-test.run guestRun) with env, and
// returns the console output and the guest's exit status. apiserver is host:port of the apiserver as
// seen from the host (the guestfwd target).
func runGuest(t *testing.T, vm vmEnv, apiserver, guestRun string, env []string) (string, int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "guest.sh")
	var b strings.Builder
	b.WriteString("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
	for _, kv := range append(env, guestEnv+"=1") {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, strconv.Quote(v))
	}
	for _, k := range []string{"CI", netns.RequireEnv, agenttest.BinEnv, controlplane.BinDirEnv, kubeproxytest.BinEnv} {
		if v, ok := os.LookupEnv(k); ok {
			fmt.Fprintf(&b, "export %s=%s\n", k, strconv.Quote(v))
		}
	}
	fmt.Fprintf(&b, "cd %s\nexec %s -test.run '%s' -test.v -test.count=1 -test.timeout=%s\n",
		strconv.Quote(wd), strconv.Quote(exe), guestRun, (vmTimeout - 30*time.Second).String())
	if err := os.WriteFile(script, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	host, port, err := splitHostPort(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"-m", "2048", "-smp", "2", "-display", "none", "-monitor", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", vm["NNM_VM_KERNEL"], "-initrd", vm["NNM_VM_INITRD"],
		// no_timer_check: under emulation on a busy host the kernel's IO-APIC timer check can miss
		// its ticks and panic ("IO-APIC + timer doesn't work!"); the check proves nothing here.
		"-append", "console=ttyS0 quiet panic=-1 no_timer_check nnm.run=" + script + " nnm.modules=" + strings.Join(guestModules, ","),
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
		"-fsdev", "local,id=mods,path=" + vm["NNM_VM_MODULES"] + ",security_model=none,readonly=on",
		"-device", "virtio-9p-pci,fsdev=mods,mount_tag=nnmmods",
		"-netdev", "user,id=n0,restrict=on,guestfwd=tcp:" + guestAPIServer + "-cmd:" + vm["NNM_VM_BUSYBOX"] + " nc " + host + " " + port,
		"-device", "virtio-net-pci,netdev=n0",
	}
	ctx, cancel := context.WithTimeout(t.Context(), vmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, vm["NNM_VM_QEMU"], args...)
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	start := time.Now()
	err = cmd.Run()
	t.Logf("VM (%s, qemu TCG, 2 vCPUs) ran for %v; qemu: %v", vm["NNM_VM_KERNEL_PACKAGE"], time.Since(start).Round(100*time.Millisecond), err)
	m := exitRE.FindStringSubmatch(console.String())
	if m == nil {
		t.Fatalf("the guest did not report an exit status (qemu: %v, context: %v); console:\n%s", err, ctx.Err(), console.String())
	}
	rc, _ := strconv.Atoi(m[1])
	return console.String(), rc
}

func splitHostPort(server string) (string, string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// guestKubeconfig writes the admin kubeconfig with the server the guest dials (the guestfwd address);
// the CA and tls-server-name stay, so the guest verifies the apiserver as every other client does.
func guestKubeconfig(t *testing.T, cp *controlplane.ControlPlane) string {
	t.Helper()
	data, err := os.ReadFile(cp.AdminKubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(cp.Server())) {
		t.Fatalf("admin kubeconfig does not name %s", cp.Server())
	}
	path := filepath.Join(t.TempDir(), "guest-kubeconfig.yaml")
	if err := os.WriteFile(path, bytes.ReplaceAll(data, []byte(cp.Server()), []byte("https://"+guestAPIServer)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// requireHost checks everything the host side needs, or ends the test (unavailable).
func requireHost(t *testing.T) vmEnv {
	t.Helper()
	if os.Getenv(guestEnv) != "" {
		t.Skip("host half: runs on the host, not in the guest")
	}
	if testing.Short() {
		t.Skip("VM lane: skipped with -short")
	}
	if os.Geteuid() != 0 {
		netns.Unavailable(t, "the VM lane needs root (network namespaces for the control plane)")
	}
	vm := loadVM(t)
	if err := controlplane.CheckPrerequisites(""); err != nil {
		netns.Unavailable(t, "%v", err)
	}
	if err := agenttest.CheckPrerequisites(); err != nil {
		netns.Unavailable(t, "%v", err)
	}
	if _, err := kubeproxytest.Binary(); err != nil {
		netns.Unavailable(t, "%v", err)
	}
	return vm
}

// TestKubeProxyIPVSInVM (host half) starts the control plane, creates the Node and the two
// LoadBalancer Services with their EndpointSlices, boots the VM and runs TestGuestKubeProxyIPVS
// there; the guest's verdict and log are this test's.
func TestKubeProxyIPVSInVM(t *testing.T) {
	vm := requireHost(t)
	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	c := cp.AdminClient()
	if err := kubeproxytest.CreateNode(ctx, c, nodeName, plans[0].nodeIP, plans[1].nodeIP); err != nil {
		t.Fatal(err)
	}
	local := createLB(t, c, "lb-local", func(p plan) string { return p.lbLocal }, nil)
	createLB(t, c, "lb-proxy", func(p plan) string { return p.lbProxy }, ptr.To(corev1.LoadBalancerIPModeProxy))
	console, rc := runGuest(t, vm, cp.Server(), "^TestGuestKubeProxyIPVS$", []string{
		"KUBECONFIG=" + guestKubeconfig(t, cp),
		"NNM_VM_CLUSTER_IPS=" + strings.Join(local.Spec.ClusterIPs, ","),
	})
	t.Logf("guest console:\n%s", guestLog(console))
	if rc != 0 {
		t.Fatalf("the guest test failed (exit %d)", rc)
	}
	if !strings.Contains(console, "--- PASS: TestGuestKubeProxyIPVS") {
		t.Fatal("the guest test did not report PASS")
	}
}

// guestLog drops the kernel's and init's noise before the guest test's output.
func guestLog(console string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if line := sc.Text(); !strings.HasPrefix(line, "[") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// createLB creates a dual-stack LoadBalancer Service (externalTrafficPolicy: Local, TCP servicePort →
// endpointPort) with one ingress IP per family in its status, and per family an EndpointSlice with
// one ready endpoint on the other node.
func createLB(t *testing.T, c kubernetes.Interface, name string, ingressIP func(plan) string, ipMode *corev1.LoadBalancerIPMode) *corev1.Service {
	t.Helper()
	ctx := t.Context()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNamespace},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Selector:              map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(endpointPort),
			}},
		},
	}
	svc, err := c.CoreV1().Services(svcNamespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ingressIP(p), IPMode: ipMode})
	}
	if svc, err = c.CoreV1().Services(svcNamespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: name + "-" + p.family, Namespace: svcNamespace,
				Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "nnm-vm-test"},
			},
			AddressType: map[string]discoveryv1.AddressType{"ipv4": discoveryv1.AddressTypeIPv4, "ipv6": discoveryv1.AddressTypeIPv6}[p.family],
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{p.endpoint},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				NodeName:   ptr.To(remoteNodeName),
			}},
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](endpointPort)}},
		}
		if _, err := c.DiscoveryV1().EndpointSlices(svcNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return svc
}
