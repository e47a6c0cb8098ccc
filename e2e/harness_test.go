package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// Agent settings shared by every scenario: short periods keep the suite fast.
const (
	minSyncPeriod = 100 * time.Millisecond
	syncPeriod    = 2 * time.Second
	podCIDRv4     = "10.244.1.0/24"
	podCIDRv6     = "fd00:10:244:1::/64"
	readyTimeout  = 30 * time.Second
	// converge bounds how long a change may take to reach the kernel (a few sync periods).
	converge = 10 * time.Second

	saNamespace = "kube-system"
	saName      = "network-node-manager"

	fixDrop  = "invalid-drop"
	fixExtIP = "ipvs-externalip-dnat"
)

var backendNames = []string{"iptables", "nftables"}

// ---- prerequisites and the shared control planes ----

// require ends the test unless the whole end-to-end setup can run here (netns.Unavailable: a skip,
// or a failure under CI).
func require(t *testing.T) {
	t.Helper()
	requireAgent(t)
	if err := controlplane.CheckPrerequisites(""); err != nil {
		netns.Unavailable(t, "end-to-end scenario: %v", err)
	}
}

// eachBackend runs test once per backend, the backends in parallel, each on its backend's shared
// control plane (sharedCluster).
func eachBackend(t *testing.T, test func(t *testing.T, c *cluster, backend string)) {
	t.Helper()
	require(t)
	for _, be := range backendNames {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			test(t, sharedCluster(t, be), be)
		})
	}
}

// requireAgent is require without the control plane, for scenarios whose agent has no API server.
func requireAgent(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end scenario: skipped with -short")
	}
	if err := agenttest.CheckPrerequisites(); err != nil {
		netns.Unavailable(t, "end-to-end scenario: %v", err)
	}
	netns.Require(t, "iptables-save", "ip6tables-save", "nft")
}

// cluster is a control plane with the project's RBAC applied.
type cluster struct {
	cp    *controlplane.ControlPlane
	admin kubernetes.Interface
	key   string
}

var clusters = struct {
	sync.Mutex
	m map[string]*cluster
}{m: map[string]*cluster{}}

// sharedCluster returns the control plane for key, starting it (and applying deploy/base) on first use.
// TestMain closes them all.
func sharedCluster(t *testing.T, key string) *cluster {
	t.Helper()
	require(t)
	clusters.Lock()
	defer clusters.Unlock()
	if c, ok := clusters.m[key]; ok {
		if c == nil {
			t.Fatalf("control plane %q failed to start earlier", key)
		}
		return c
	}
	clusters.m[key] = nil
	start := time.Now()
	cp, err := controlplane.Start(context.Background(), controlplane.Options{
		// Accept IPv4 addresses with leading zeros, as kube-apiserver did before strict validation
		// (beta, on by default): Services holding them survive upgrades, and the agent must skip them
		// (scenario 5).
		ExtraAPIServerArgs: []string{"--feature-gates=StrictIPCIDRValidation=false"},
	})
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	c := &cluster{cp: cp, admin: cp.AdminClient(), key: key}
	if err := agenttest.ApplyManifests(t.Context(), c.cp.AdminRESTConfig(), manifestFiles(t), nil); err != nil {
		_ = cp.Close()
		t.Fatalf("apply deploy/base: %v", err)
	}
	clusters.m[key] = c
	t.Logf("control plane %q (%s) up in %v", key, cp.Netns(), time.Since(start).Round(time.Millisecond))
	return c
}

func closeClusters() {
	clusters.Lock()
	defer clusters.Unlock()
	for key, c := range clusters.m {
		if c != nil {
			if err := c.cp.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "close control plane %s: %v\n", key, err)
			}
		}
	}
	clusters.m = map[string]*cluster{}
}

func TestMain(m *testing.M) {
	code := m.Run()
	closeClusters()
	os.Exit(code)
}

// ---- deployment manifests ----

func manifestFiles(t *testing.T) []string {
	t.Helper()
	files, err := agenttest.DeployBaseFiles()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// ---- a node: netns + agent ----

type nodeOptions struct {
	// config is the YAML config file content; default defaultConfig.
	config string
	// sa is the ServiceAccount the agent authenticates as (namespace kube-system); default the manifest's.
	sa string
	// args are extra agent flags.
	args []string
	// noWait skips waiting for /readyz.
	noWait bool
	// setup prepares the node's netns before the agent starts (e.g. a predecessor's chains).
	setup func(t *testing.T, ns *netns.NS)
	// kubeconfig replaces the ServiceAccount kubeconfig of the cluster; with no cluster and no
	// kubeconfig the agent gets no --kubeconfig.
	kubeconfig string
	// env is added to the agent's environment.
	env []string
}

const defaultConfig = `# written by the e2e test
fixes:
  invalid-drop:
    enabled: true
  ipvs-externalip-dnat:
    enabled: true
`

type node struct {
	t       *testing.T
	c       *cluster
	ns      *netns.NS
	name    string // Node name given to the agent
	backend string
	config  string // config file path
	agent   *agenttest.Agent
	variant string // iptables variant the agent chose (from agent_info)
	args    []string
	env     []string
}

// startNode creates a node netns wired to the control plane (c may be nil: no control plane) and
// starts the agent in it with the ServiceAccount identity, then waits for /readyz.
func startNode(t *testing.T, c *cluster, backend string, o nodeOptions) *node {
	t.Helper()
	ns := netns.New(t, "nnm-e2e")
	n := &node{t: t, c: c, ns: ns, name: "node-" + ns.Name[len(ns.Name)-8:], backend: backend}
	if o.sa == "" {
		o.sa = saName
	}
	if o.config == "" {
		o.config = defaultConfig
	}
	var args []string
	if c != nil {
		kc, err := c.cp.ServiceAccountKubeconfig(t.Context(), saNamespace, o.sa, ns.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.cp.DisconnectNamespace(ns.Name) })
		if o.kubeconfig == "" {
			o.kubeconfig = kc
		}
	}
	if o.kubeconfig != "" {
		args = append(args, "--kubeconfig", o.kubeconfig)
	}
	n.config = filepath.Join(t.TempDir(), "config.yaml")
	n.writeConfig(o.config)
	if o.setup != nil {
		o.setup(t, ns)
	}
	args = append(args,
		"--node-name", n.name,
		"--backend", backend,
		"--proxy-mode", "ipvs",
		"--config", n.config,
		"--min-sync-period", minSyncPeriod.String(),
		"--sync-period", syncPeriod.String(),
		"--pod-cidrs", podCIDRv4+","+podCIDRv6,
		"--log-level", "debug",
	)
	n.args, n.env = append(args, o.args...), o.env
	n.agent = agenttest.StartT(t, agenttest.Options{Netns: ns.Name, Args: n.args, Env: n.env})
	if !o.noWait {
		n.waitReady()
	}
	return n
}

// switchBackend stops the agent and starts it again in the same namespace with --backend be: the
// backend changed between two runs (kube-proxy moved from IPVS to nftables mode and auto followed it).
func (n *node) switchBackend(be string) {
	n.t.Helper()
	if err := n.agent.Stop(agenttest.StopGrace); err != nil {
		n.t.Fatal(err)
	}
	n.args = slices.Clone(n.args)
	for i := range n.args[:len(n.args)-1] {
		if n.args[i] == "--backend" {
			n.args[i+1] = be
		}
	}
	n.backend = be
	n.agent = agenttest.StartT(n.t, agenttest.Options{Netns: n.ns.Name, Args: n.args, Env: n.env})
	n.waitReady()
}

// as is n seen through backend be: fixPresent and fixAbsent then look at be's objects.
func (n *node) as(be string) *node {
	o := *n
	o.backend = be
	if o.variant == "" {
		o.variant = "nft"
	}
	return &o
}

func (n *node) waitReady() {
	n.t.Helper()
	n.agent.WaitReadyT(n.t, readyTimeout)
	m := n.agent.MetricsT(n.t)
	for _, s := range m.Find("nnm_agent_info") {
		n.variant = s.Labels["iptables_variant"]
	}
}

func (n *node) writeConfig(content string) {
	n.t.Helper()
	// Write-and-rename, as a ConfigMap update does, so the watcher never reads half a file.
	tmp := n.config + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.config); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) metrics() agenttest.Metrics {
	n.t.Helper()
	return n.agent.MetricsT(n.t)
}

// metric returns the value of a sample; a missing sample fails the test.
func (n *node) metric(name string, labels ...string) float64 {
	n.t.Helper()
	v, ok := n.metrics().Value(name, labels...)
	if !ok {
		n.t.Fatalf("metric %s%v not exported", name, labels)
	}
	return v
}

// ---- the kernel's view ----

// dump returns everything of ours (and the built-in chains' jumps) in the node's kernel, for failure
// messages.
func (n *node) dump() string {
	ctx := context.Background()
	var b strings.Builder
	if n.backend == "nftables" {
		out, err := agenttest.NftList(ctx, n.ns.Name)
		fmt.Fprintf(&b, "nft list ruleset (err %v):\n%s", err, out)
		return b.String()
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		for _, table := range []string{"mangle", "filter", "nat"} {
			out, err := agenttest.IptablesSave(ctx, n.ns.Name, n.variant, fam, table)
			fmt.Fprintf(&b, "%s %s (err %v):\n%s", fam, table, err, out)
		}
	}
	return b.String()
}

var (
	reDst   = regexp.MustCompile(`-d (\S+?)(?:/(?:32|128))? `)
	reProto = regexp.MustCompile(`-p (\S+) `)
	reDport = regexp.MustCompile(`--dport (\d+)`)
	reTo    = regexp.MustCompile(`--to-destination (\S+)`)
)

// dnatEntries returns the External-IP DNAT entries the kernel holds for a family, sorted, each as
// "<external-ip> <proto> <port> -> <cluster-ip:port>"; (nil, nil) when our table/chain is absent.
func (n *node) dnatEntries(family string) ([]string, error) {
	ctx := n.t.Context()
	var out []string
	if n.backend == "iptables" {
		save, err := agenttest.IptablesSave(ctx, n.ns.Name, n.variant, family, "nat")
		if err != nil {
			return nil, err
		}
		// The entries sit in bucket chains NNM-EXTIP-DNAT-<prefix> (one per destination /28 or
		// /124) that NNM-EXTIP-DNAT dispatches to, through dispatch nodes when there are many, or
		// inlined into the chain that lists them (a bucket of one rule); only the DNAT rules of
		// chains reached from NNM-EXTIP-DNAT are in effect.
		jumps := map[string][]string{}
		for _, line := range agenttest.Lines(save, "-A NNM-EXTIP-DNAT", "-j NNM-EXTIP-DNAT-") {
			from, _, _ := strings.Cut(strings.TrimPrefix(line, "-A "), " ")
			jumps[from] = append(jumps[from], line[strings.LastIndex(line, " ")+1:])
		}
		chains := map[string]bool{"NNM-EXTIP-DNAT": true}
		for todo := []string{"NNM-EXTIP-DNAT"}; len(todo) > 0; {
			c := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			for _, to := range jumps[c] {
				if !chains[to] {
					chains[to] = true
					todo = append(todo, to)
				}
			}
		}
		for _, line := range agenttest.Lines(save, "-A NNM-EXTIP-DNAT", "-j DNAT") {
			if name, _, _ := strings.Cut(strings.TrimPrefix(line, "-A "), " "); !chains[name] {
				continue
			}
			d, p, port, to := reDst.FindStringSubmatch(line), reProto.FindStringSubmatch(line), reDport.FindStringSubmatch(line), reTo.FindStringSubmatch(line)
			if d == nil || p == nil || port == nil || to == nil {
				return nil, fmt.Errorf("unexpected DNAT rule %q", line)
			}
			ap, err := netip.ParseAddrPort(to[1])
			if err != nil {
				return nil, fmt.Errorf("DNAT target in %q: %w", line, err)
			}
			out = append(out, entry(d[1], p[1], port[1], ap))
		}
	} else {
		fam := agenttest.NftFamily(family)
		raw, err := netns.Exec(ctx, n.ns.Name, "nft", "-j", "list", "table", fam, "nnm-"+fixExtIP)
		if err != nil {
			if strings.Contains(raw, "No such file or directory") {
				return nil, nil
			}
			return nil, err
		}
		if out, err = nftMapEntries(raw); err != nil {
			return nil, err
		}
	}
	sort.Strings(out)
	return out, nil
}

func entry(ip, proto, port string, to netip.AddrPort) string {
	return fmt.Sprintf("%s %s %s -> %s", ip, proto, port, to)
}

// nftMapEntries reads the elements of every map in `nft -j list table` output. An element is
// [key, value] with key {"concat": [ip, proto, port]} (possibly wrapped in {"elem": {"val": …}}) and
// value {"concat": [ip, port]}.
func nftMapEntries(raw string) ([]string, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		return nil, fmt.Errorf("parse nft -j output: %w", err)
	}
	var out []string
	for _, obj := range doc.Nftables {
		m, ok := obj["map"]
		if !ok {
			continue
		}
		var mp struct {
			Elem [][2]json.RawMessage `json:"elem"`
		}
		if err := json.Unmarshal(m, &mp); err != nil {
			return nil, fmt.Errorf("parse nft map: %w", err)
		}
		for _, el := range mp.Elem {
			key, err := concat(el[0])
			if err != nil {
				return nil, err
			}
			val, err := concat(el[1])
			if err != nil {
				return nil, err
			}
			if len(key) != 3 || len(val) != 2 {
				return nil, fmt.Errorf("unexpected map element %s : %s", el[0], el[1])
			}
			ip, err := netip.ParseAddr(val[0])
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(val[1], 10, 16)
			if err != nil {
				return nil, err
			}
			out = append(out, entry(key[0], key[1], key[2], netip.AddrPortFrom(ip, uint16(port))))
		}
	}
	return out, nil
}

// concat decodes {"concat": [...]} (or {"elem": {"val": {"concat": …}}}) into strings.
func concat(raw json.RawMessage) ([]string, error) {
	var w struct {
		Concat []any `json:"concat"`
		Elem   *struct {
			Val json.RawMessage `json:"val"`
		} `json:"elem"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("nft element %s: %w", raw, err)
	}
	if w.Elem != nil {
		return concat(w.Elem.Val)
	}
	if w.Concat == nil {
		return nil, fmt.Errorf("nft element %s is not a concatenation", raw)
	}
	var out []string
	for _, v := range w.Concat {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case float64:
			out = append(out, strconv.FormatFloat(x, 'f', -1, 64))
		default:
			return nil, fmt.Errorf("nft element %s: unexpected %T", raw, v)
		}
	}
	return out, nil
}

// fixTable lists the nftables table of a fix for a family ("" when it is missing), with nft's name of
// the family.
func (n *node) fixTable(fixID, family string) (fam, out string, err error) {
	fam = agenttest.NftFamily(family)
	out, err = agenttest.NftListTable(n.t.Context(), n.ns.Name, fam, "nnm-"+fixID)
	return fam, out, err
}

// fixPresent reports whether a fix's hooked chains are in the kernel for a family: for iptables the
// NNM- chains and the jumps from the built-in chains, for nftables the fix's table with base chains.
func (n *node) fixPresent(fixID, family string) error {
	ctx := n.t.Context()
	if n.backend == "nftables" {
		fam, out, err := n.fixTable(fixID, family)
		if err != nil {
			return err
		}
		if out == "" {
			return fmt.Errorf("table %s nnm-%s is missing", fam, fixID)
		}
		want := map[string][]string{
			fixDrop:  {"chain invalid-input", "hook input", "ct state invalid", "drop"},
			fixExtIP: {"chain extip-prerouting", "chain extip-output", "chain extip-dnat", "chain extip-postrouting", "masquerade", "dnat"},
		}[fixID]
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("table %s nnm-%s lacks %q:\n%s", fam, fixID, w, out)
			}
		}
		return nil
	}
	table, chains := "mangle", map[string]string{"INPUT": "NNM-INVALID-INPUT"}
	want := []string{"--ctstate INVALID", "-j DROP"}
	if fixID == fixExtIP {
		table = "nat"
		chains = map[string]string{"PREROUTING": "NNM-EXTIP-PREROUTING", "OUTPUT": "NNM-EXTIP-OUTPUT"}
		chains["POSTROUTING"] = "NNM-EXTIP-POSTROUTING"
		// POSTROUTING's rules are dispatch rules per bucket of entries (masquerade by the
		// connection's original destination): without an entry the chain is empty.
		want = []string{":NNM-EXTIP-POSTROUTING", "-A NNM-EXTIP-OUTPUT"}
	}
	out, err := agenttest.IptablesSave(ctx, n.ns.Name, n.variant, family, table)
	if err != nil {
		return err
	}
	for builtin, chain := range chains {
		jump := fmt.Sprintf("-A %s -m comment --comment \"network-node-manager:%s\" -j %s", builtin, fixID, chain)
		if !strings.Contains(out, jump) {
			return fmt.Errorf("%s %s: jump %q missing:\n%s", family, table, jump, out)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			return fmt.Errorf("%s %s lacks %q:\n%s", family, table, w, out)
		}
	}
	return nil
}

// fixAbsent reports an error if anything of the fix is left in the kernel for a family.
func (n *node) fixAbsent(fixID, family string) error {
	if n.backend == "nftables" {
		fam, out, err := n.fixTable(fixID, family)
		if err != nil {
			return err
		}
		if out != "" {
			return fmt.Errorf("table %s nnm-%s still present:\n%s", fam, fixID, out)
		}
		return nil
	}
	// invalid-drop: mangle, and filter where versions before issue #20 put it.
	table, marker := "", "NNM-INVALID-"
	if fixID == fixExtIP {
		table, marker = "nat", "NNM-EXTIP-"
	}
	out, err := agenttest.IptablesSave(n.t.Context(), n.ns.Name, n.variant, family, table)
	if err != nil {
		return err
	}
	if table == "" {
		table = "every table"
	}
	if l := agenttest.Lines(out, marker); len(l) > 0 {
		return fmt.Errorf("%s %s still holds %s: %q", family, table, marker, l)
	}
	if l := agenttest.Lines(out, "network-node-manager:"+fixID); len(l) > 0 {
		return fmt.Errorf("%s %s still holds jumps of %s: %q", family, table, fixID, l)
	}
	return nil
}

// expectEntries waits until the kernel holds exactly want (both families together, any order): nothing
// missing, nothing stale. It returns how long that took.
func (n *node) expectEntries(timeout time.Duration, want ...string) time.Duration {
	n.t.Helper()
	sort.Strings(want)
	var got []string
	start := time.Now()
	err := agenttest.Poll(n.t.Context(), timeout, 20*time.Millisecond, func() error {
		got = nil
		for _, fam := range []string{"ipv4", "ipv6"} {
			e, err := n.dnatEntries(fam)
			if err != nil {
				return err
			}
			got = append(got, e...)
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("kernel DNAT entries:\n  got  %q\n  want %q", got, want)
		}
		return nil
	})
	if err != nil {
		n.t.Fatalf("%s: %v\n%s", n.backend, err, n.dump())
	}
	return time.Since(start)
}

// ---- Services ----

type svcMutator func(*corev1.Service)

// lbService is a single-stack IPv4 LoadBalancer Service with TCP port 80 unless mutators say otherwise.
func lbService(ns, name string, mut ...svcMutator) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			AllocateLoadBalancerNodePorts: ptr(false),
			Selector:                      map[string]string{"app": name},
			Ports:                         []corev1.ServicePort{tcpPort("http", 80)},
		},
	}
	for _, m := range mut {
		m(svc)
	}
	return svc
}

func tcpPort(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: intstr.FromInt32(port + 8000), Protocol: corev1.ProtocolTCP}
}

func udpPort(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: intstr.FromInt32(port), Protocol: corev1.ProtocolUDP}
}

func withPorts(p ...corev1.ServicePort) svcMutator {
	return func(s *corev1.Service) { s.Spec.Ports = p }
}

func dualStack(s *corev1.Service) {
	s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyRequireDualStack)
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

func ipv6Only(s *corev1.Service) {
	s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicySingleStack)
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
}

func withExternalIPs(ips ...string) svcMutator {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func ptr[T any](v T) *T { return &v }

// services is a test's handle on one Kubernetes namespace; everything in it is deleted at test end.
type services struct {
	t  *testing.T
	cs kubernetes.Interface
	ns string
}

func newServices(t *testing.T, c *cluster, ns string) *services {
	t.Helper()
	if err := agenttest.EnsureNamespace(t.Context(), c.admin, ns); err != nil {
		t.Fatal(err)
	}
	s := &services{t: t, cs: c.admin, ns: ns}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		list, err := s.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("cleanup: list services in %s: %v", ns, err)
			return
		}
		for _, svc := range list.Items {
			if err := s.cs.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Logf("cleanup: delete service %s/%s: %v", ns, svc.Name, err)
			}
		}
	})
	return s
}

func (s *services) create(svc *corev1.Service) *corev1.Service {
	s.t.Helper()
	svc.Namespace = s.ns
	got, err := s.cs.CoreV1().Services(s.ns).Create(s.t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("create service %s/%s: %v", s.ns, svc.Name, err)
	}
	return got
}

func (s *services) get(name string) *corev1.Service {
	s.t.Helper()
	got, err := s.cs.CoreV1().Services(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// update applies mutate to the current object (retrying on conflicts) and returns the result.
func (s *services) update(name string, mutate svcMutator) *corev1.Service {
	s.t.Helper()
	return s.write("update service", name, mutate, s.cs.CoreV1().Services(s.ns).Update)
}

// setIngress writes status.loadBalancer.ingress through the status subresource, as a cloud controller
// does. An entry "IP/proxy" gets ipMode Proxy, a plain "IP" ipMode VIP.
func (s *services) setIngress(name string, ips ...string) *corev1.Service {
	s.t.Helper()
	return s.write("set ingress of", name, func(svc *corev1.Service) { svc.Status.LoadBalancer.Ingress = ingress(ips...) },
		s.cs.CoreV1().Services(s.ns).UpdateStatus)
}

// write applies mutate to the current object and stores it with put (Update, or UpdateStatus for the
// status subresource), retrying on conflicts, and returns the result; what names the change in the
// failure.
func (s *services) write(what, name string, mutate svcMutator,
	put func(context.Context, *corev1.Service, metav1.UpdateOptions) (*corev1.Service, error)) *corev1.Service {
	s.t.Helper()
	var got *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := s.cs.CoreV1().Services(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(cur)
		got, err = put(s.t.Context(), cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		s.t.Fatalf("%s %s/%s: %v", what, s.ns, name, err)
	}
	return got
}

func ingress(ips ...string) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for _, ip := range ips {
		mode := corev1.LoadBalancerIPModeVIP
		if v, ok := strings.CutSuffix(ip, "/proxy"); ok {
			ip, mode = v, corev1.LoadBalancerIPModeProxy
		}
		out = append(out, corev1.LoadBalancerIngress{IP: ip, IPMode: &mode})
	}
	return out
}

func (s *services) delete(name string) {
	s.t.Helper()
	if err := s.cs.CoreV1().Services(s.ns).Delete(s.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("delete service %s/%s: %v", s.ns, name, err)
	}
}

// clusterIP returns the Service's Cluster-IP of a family ("" if none).
func clusterIP(svc *corev1.Service, family string) string {
	for _, ip := range svc.Spec.ClusterIPs {
		a, err := netip.ParseAddr(ip)
		if err == nil && a.Is4() == (family == "ipv4") {
			return a.String()
		}
	}
	return ""
}

// familyOf is the family ("ipv4", "ipv6") of the address ip, as the agent's metrics and tables name it.
func familyOf(ip string) string {
	if netip.MustParseAddr(ip).Is6() {
		return "ipv6"
	}
	return "ipv4"
}

// want builds an expected DNAT entry for a Service port: External-IP ext → the Service's Cluster-IP of
// ext's family, same port.
func want(svc *corev1.Service, ext, proto string, port int) string {
	a := netip.MustParseAddr(ext)
	fam := familyOf(ext)
	cip := clusterIP(svc, fam)
	if cip == "" {
		panic(fmt.Sprintf("service %s has no %s cluster IP", svc.Name, fam))
	}
	return entry(a.String(), proto, strconv.Itoa(port), netip.AddrPortFrom(netip.MustParseAddr(cip), uint16(port)))
}
