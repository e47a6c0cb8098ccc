package diagnose

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// fakeKernel is a Kernel of fixed answers.
type fakeKernel struct {
	links   []Link
	routes  []Route
	neigh   map[rules.Family]int
	fulls   map[rules.Family]uint64
	ifconf  map[string]string // "dev/name" → value
	ipt     map[rules.Family]string
	nft     map[string]string // args joined by " " → output
	nftErrs bool
}

func (k *fakeKernel) Links() ([]Link, error)                    { return k.links, nil }
func (k *fakeKernel) Routes() ([]Route, error)                  { return k.routes, nil }
func (k *fakeKernel) Neighbours() (map[rules.Family]int, error) { return k.neigh, nil }
func (k *fakeKernel) NeighbourStats(f rules.Family) (int, uint64, error) {
	return k.neigh[f], k.fulls[f], nil
}
func (k *fakeKernel) InterfaceSysctl(_ rules.Family, dev, name string) (string, error) {
	if v, ok := k.ifconf[dev+"/"+name]; ok {
		return v, nil
	}
	return "", errors.New("no such file or directory")
}

// IptablesSave returns the section of table in the family's save text ("*table" to COMMIT).
func (k *fakeKernel) IptablesSave(_ context.Context, _ string, f rules.Family, table string) (string, error) {
	_, rest, ok := strings.Cut(k.ipt[f], "*"+table+"\n")
	if !ok {
		return "", nil
	}
	section, _, _ := strings.Cut(rest, "COMMIT\n")
	return "*" + table + "\n" + section + "COMMIT\n", nil
}
func (k *fakeKernel) NftList(_ context.Context, args ...string) (string, error) {
	if v, ok := k.nft[strings.Join(args, " ")]; ok {
		return v, nil
	}
	return "", errors.New("Error: No such file or directory")
}

type fakeStats struct{ s nodestate.ConntrackStats }

func (f fakeStats) Stats(context.Context) (nodestate.ConntrackStats, error) { return f.s, nil }

func ptr[T any](v T) *T { return &v }

func entry(proto rules.Protocol, src, dst, dnat string) nodestate.ConntrackEntry {
	d := netip.MustParseAddrPort(dst)
	to := netip.MustParseAddrPort(dnat)
	return nodestate.ConntrackEntry{Family: rules.IPv4, Protocol: proto,
		Orig:  nodestate.ConntrackTuple{Src: netip.MustParseAddrPort(src), Dst: d},
		Reply: nodestate.ConntrackTuple{Src: to, Dst: netip.MustParseAddrPort(src)}}
}

// troubled is a node with every problem: the golden report.
func troubled() *Env {
	svc := testkit.Service("shop", "web", testkit.LoadBalancer("203.0.113.10"), testkit.ETPLocal(), testkit.Ports(testkit.TCP(80)))
	elsewhere := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.2.7"}, NodeName: ptr("n2")}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "statsd"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}}}}
	snap := fix.NewSnapshot(fix.Env{NodeName: "n1"}, nil)
	inputs.Services.Set(snap, []*fix.Service{fix.ServiceFrom(svc)})
	inputs.EndpointSlices.Set(snap, []*discoveryv1.EndpointSlice{elsewhere})
	inputs.Pods.Set(snap, []*corev1.Pod{pod})
	return &Env{
		Node: "n1", ProxyMode: "ipvs", ProxyModeSource: "metrics-endpoint", IptablesVariant: "nft", Override: "override 0 (pool=canary)",
		Fixes: []FixState{{ID: "invalid-drop"}, {ID: "conntrack-liberal"}, {ID: "ipvs-externalip-dnat"}, {ID: "mss-clamp"}, {ID: "stale-udp-conntrack"},
			{ID: "conntrack-capacity"}, {ID: "neighbour-table"}, {ID: "nodeport-reserved-ports"}},
		Sysctl: nodestate.NewFakeSysctl(map[string]string{
			nodestate.ConntrackTCPBeLiberal:      "0",
			"net.netfilter.nf_conntrack_count":   "950",
			"net.netfilter.nf_conntrack_max":     "1000",
			"net.netfilter.nf_conntrack_buckets": "1000",
			"net.ipv4.neigh.default.gc_thresh1":  "128",
			"net.ipv4.neigh.default.gc_thresh2":  "512",
			"net.ipv4.neigh.default.gc_thresh3":  "1024",
			"net.ipv6.neigh.default.gc_thresh1":  "128",
			"net.ipv6.neigh.default.gc_thresh2":  "512",
			"net.ipv6.neigh.default.gc_thresh3":  "1024",
			"net.ipv4.ip_local_port_range":       "1024\t65535",
			"net.ipv4.ip_local_reserved_ports":   "10250",
		}),
		Host:  func() (uint64, int, error) { return 8 << 30, 4, nil },
		Stats: fakeStats{nodestate.ConntrackStats{Invalid: 42, InsertFailed: 3, Drop: 0, EarlyDrop: 7, CPUs: 2}},
		Conntrack: nodestate.NewFakeConntrack(
			entry(rules.UDP, "192.0.2.50:40000", "192.0.2.1:8125", "10.244.1.9:8125"), // pod gone
			entry(rules.UDP, "192.0.2.51:40000", "192.0.2.1:8125", "10.244.1.5:8125"), // live pod
			entry(rules.UDP, "10.244.1.5:5000", "10.96.0.10:53", "10.244.2.3:53"),     // another node's pod
		),
		Kernel: &fakeKernel{
			links: []Link{{"lo", 65536, true}, {"eth0", 1450, true}, {"cni0", 1500, true}},
			routes: []Route{
				{rules.IPv4, netip.MustParsePrefix("0.0.0.0/0"), "eth0", 0},
				{rules.IPv4, netip.MustParsePrefix("192.0.2.0/24"), "eth0", 0},
				{rules.IPv4, netip.MustParsePrefix("10.244.1.0/24"), "cni0", 0},
			},
			neigh:  map[rules.Family]int{rules.IPv4: 1000, rules.IPv6: 3},
			ifconf: map[string]string{"all/rp_filter": "0", "eth0/rp_filter": "1", "cni0/rp_filter": "0"},
			// Only the filter table is read: the nat rule's counters would change the golden output.
			ipt: map[rules.Family]string{rules.IPv4: "*nat\n[999:9999] -A KUBE-SERVICES -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n" +
				"*filter\n[12:720] -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n"},
		},
		PodCIDRs:     []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Cluster:      snap,
		Missing:      map[string]string{},
		Families:     []rules.Family{rules.IPv4},
		RuleCounters: kernelRules.counters,
		Agent:        "the running agent (pid 1, status written 2026-12-08T10:00:00Z)",
	}
}

// kernelRules holds, per rule fix, the counters its rules have in the kernel of every family.
type rulesInKernel map[string]map[string]uint64

func (k rulesInKernel) counters(_ context.Context, fix string, _ rules.Family) (map[string]uint64, error) {
	return k[fix], nil
}

var kernelRules = rulesInKernel{
	"invalid-drop": {"dropped-input": 3},
	"mss-clamp":    {"from-pods": 1, "to-pods": 1},
}

var lastOK = time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)

// enable enables the fixes as the running agent reports them: last sync ok.
func enable(env *Env, ids ...string) {
	for i := range env.Fixes {
		for _, id := range ids {
			if env.Fixes[i].ID == id {
				env.Fixes[i].Enabled = true
				env.Fixes[i].Sync = &SyncState{OK: true, LastOK: lastOK}
			}
		}
	}
}

func states(r *Report) map[string]string {
	out := map[string]string{}
	for _, f := range r.Findings {
		s := string(f.State)
		if f.State == Handled {
			s += " by " + f.HandledBy
		}
		out[f.Check] = s
	}
	return out
}

// The golden report of a node with every problem: text and JSON, and exit status 2.
func TestGoldenReport(t *testing.T) {
	r := Run(context.Background(), troubled(), Checks())
	var text, js bytes.Buffer
	if err := Text(&text, r); err != nil {
		t.Fatal(err)
	}
	if err := JSON(&js, r); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "testdata/troubled.txt", text.String())
	testkit.Golden(t, "testdata/troubled.json", js.String())
	var doc map[string]any
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil || doc["schemaVersion"] != float64(1) {
		t.Fatalf("schemaVersion: %v (%v)", doc["schemaVersion"], err)
	}
	if r.ExitCode() != ExitProblem {
		t.Errorf("exit code %d, want %d", r.ExitCode(), ExitProblem)
	}
}

// Each problem a fix handles says "handled by" that fix once it is enabled and in force (the
// kernel holds what it asks for); the report-only ones stay problems.
func TestHandledBy(t *testing.T) {
	before := states(Run(context.Background(), troubled(), Checks()))
	for check, want := range map[string]string{
		"invalid-replies": "problem", "ipvs-external-ip": "problem", "pmtu": "problem", "stale-udp": "problem",
		"conntrack-table": "problem", "neighbour-table": "problem", "nodeport-ephemeral": "problem", "rp-filter": "problem",
	} {
		if before[check] != want {
			t.Errorf("%s: %s, want %s", check, before[check], want)
		}
	}
	env := inForce(troubled())
	after := states(Run(context.Background(), env, Checks()))
	for check, want := range map[string]string{
		"invalid-replies": "handled by invalid-drop", "ipvs-external-ip": "handled by ipvs-externalip-dnat",
		"pmtu": "handled by mss-clamp", "stale-udp": "handled by stale-udp-conntrack",
		"conntrack-table": "handled by conntrack-capacity", "neighbour-table": "handled by neighbour-table",
		"nodeport-ephemeral": "handled by nodeport-reserved-ports", "rp-filter": "problem",
	} {
		if after[check] != want {
			t.Errorf("%s with the fixes enabled: %s, want %s", check, after[check], want)
		}
	}
	env = troubled()
	enable(env, "conntrack-liberal")
	if got := states(Run(context.Background(), env, Checks()))["invalid-replies"]; got != "problem" {
		t.Errorf("invalid-replies with conntrack-liberal enabled and the sysctl at 0: %s", got)
	}
	_ = env.Sysctl.Set(nodestate.ConntrackTCPBeLiberal, "1")
	if got := states(Run(context.Background(), env, Checks()))["invalid-replies"]; got != "handled by conntrack-liberal" {
		t.Errorf("invalid-replies with conntrack-liberal: %s", got)
	}
}

// inForce is troubled with every fix enabled and in force: the sysctl fixes' values where their
// passes put them (nf_conntrack_max for 950 entries, gc_thresh for 1,000 neighbours, the NodePort
// range reserved).
func inForce(env *Env) *Env {
	enable(env, "invalid-drop", "ipvs-externalip-dnat", "mss-clamp", "stale-udp-conntrack", "conntrack-capacity", "neighbour-table", "nodeport-reserved-ports")
	env.Stats = fakeStats{nodestate.ConntrackStats{Invalid: 42, EarlyDrop: 7, CPUs: 2}}
	env.Kernel.(*fakeKernel).fulls = map[rules.Family]uint64{rules.IPv4: 5} // refused before the raise
	for name, v := range map[string]string{
		"net.netfilter.nf_conntrack_max": "4096", "net.netfilter.nf_conntrack_buckets": "1024",
		"net.ipv4.neigh.default.gc_thresh1": "256", "net.ipv4.neigh.default.gc_thresh2": "1024", "net.ipv4.neigh.default.gc_thresh3": "2048",
		"net.ipv4.ip_local_reserved_ports": "10250,30000-32767",
	} {
		_ = env.Sysctl.Set(name, v)
	}
	return env
}

// #61: a fix counts as handling a problem only when it is in force: enabled and not refused, its
// last sync succeeded (the running agent's status) and its rules are in the kernel. Otherwise the
// check stays a problem and says what is missing.
func TestHandledOnlyInForce(t *testing.T) {
	for name, c := range map[string]struct {
		set  func(*Env)
		want string
	}{
		"in force":            {func(*Env) {}, ""},
		"no running agent":    {func(e *Env) { e.Fixes[0].Sync = nil; e.Agent = "no running agent's status" }, "no running agent's status says its last sync succeeded (no running agent's status)"},
		"last sync failed":    {func(e *Env) { e.Fixes[0].Sync = &SyncState{Error: "nft: command not found"} }, "its last sync failed: nft: command not found"},
		"never synced":        {func(e *Env) { e.Fixes[0].Sync = &SyncState{} }, "its last sync failed: no successful sync yet"},
		"refused":             {func(e *Env) { e.Fixes[0].Refused = "kube-proxy runs in nftables mode" }, "refuses to run here: kube-proxy runs in nftables mode"},
		"rules not in kernel": {func(e *Env) { e.RuleCounters = rulesInKernel{}.counters }, "its rules are not in the kernel (ipv4: none)"},
		"rules unreadable":    {func(e *Env) { e.RuleCounters = nil }, "its rules cannot be read here"},
	} {
		env := troubled()
		enable(env, "invalid-drop")
		c.set(env)
		f := Run(context.Background(), env, []Check{invalidCheck{}}).Findings[0]
		if c.want == "" {
			if f.State != Handled {
				t.Errorf("%s: %s %s", name, f.State, f.Summary)
			}
			continue
		}
		if f.State != Problem || !strings.Contains(f.Summary, c.want) {
			t.Errorf("%s: %s %q, want a problem naming %q", name, f.State, f.Summary, c.want)
		}
	}
}

// #61: report-only problems do not make the exit status; an acknowledged check is reported as
// acknowledged, counts as no problem and makes no exit status either.
func TestAcknowledgedAndReportOnly(t *testing.T) {
	r := Run(context.Background(), inForce(troubled()), Checks())
	if r.Problems == 0 || r.Open != 0 || r.ExitCode() != 0 {
		t.Errorf("only report-only problems left: problems %d, open %d, exit %d; want exit 0", r.Problems, r.Open, r.ExitCode())
	}
	env := troubled()
	env.Acknowledged = []string{"rp-filter", "pmtu"}
	r = Run(context.Background(), env, Checks())
	for _, c := range env.Acknowledged {
		if f := r.Find(c); f.State != Acknowledged {
			t.Errorf("%s: %s, want acknowledged", c, f.State)
		}
	}
	if r.ExitCode() != ExitProblem || r.Find("invalid-replies").State != Problem {
		t.Errorf("the other problems stay: exit %d", r.ExitCode())
	}
}

// The stale-UDP preview counts only the entry DNATed into this node's pod CIDRs to an address no
// Pod holds: not the live pod's, not the other node's pod.
func TestStaleUDPPreview(t *testing.T) {
	env := troubled()
	n, ex, err := StaleUDP(context.Background(), env.Conntrack, map[netip.Addr]bool{netip.MustParseAddr("10.244.1.5"): true}, env.PodCIDRs)
	if err != nil || n != 1 || len(ex) != 1 || ex[0].Reply.Src.Addr() != netip.MustParseAddr("10.244.1.9") {
		t.Fatalf("stale: %d %v %v", n, ex, err)
	}
}

// Without API access the kernel checks still run; the others say why they cannot tell.
func TestWithoutAPI(t *testing.T) {
	env := troubled()
	env.NoAPI(errors.New("no kubeconfig and not in a cluster"))
	r := Run(context.Background(), env, Checks())
	if r.API != "no kubeconfig and not in a cluster" {
		t.Errorf("api: %q", r.API)
	}
	got := states(r)
	for _, c := range []string{"ipvs-external-ip", "stale-udp"} {
		if got[c] != "cannot-tell" || !strings.Contains(r.Find(c).Summary, "no API access") {
			t.Errorf("%s: %s %q, want cannot-tell naming the API", c, got[c], r.Find(c).Summary)
		}
	}
	for _, c := range []string{"invalid-replies", "conntrack-table", "neighbour-table", "pmtu"} {
		if got[c] == "cannot-tell" {
			t.Errorf("%s: cannot tell without the API: %s", c, r.Find(c).Summary)
		}
	}
}

// The IPVS check's logic on its inputs (IPVS cannot run on the host kernel: no IP_VS): a local
// endpoint, eTP Cluster, ipMode Proxy and hostname-only ingress are not blackholed.
func TestBlackholedExternalIPs(t *testing.T) {
	mk := func(name string, mods ...func(*corev1.Service)) *fix.Service {
		return fix.ServiceFrom(testkit.Service("ns", name, append(mods, testkit.Ports(testkit.TCP(80)))...))
	}
	svcs := []*fix.Service{
		mk("local-none", testkit.LoadBalancer("203.0.113.1"), testkit.ETPLocal()),
		mk("local-here", testkit.LoadBalancer("203.0.113.2"), testkit.ETPLocal()),
		mk("cluster", testkit.LoadBalancer("203.0.113.3")),
		mk("proxy", testkit.LoadBalancer(), testkit.IngressProxyMode("203.0.113.4"), testkit.ETPLocal()),
		mk("extip", testkit.ClusterIPType(), testkit.ExternalIPs("198.51.100.5"), testkit.ETPLocal()),
	}
	here := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "local-here-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: "local-here"}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}, NodeName: ptr("n1")}}}
	got := BlackholedExternalIPs(svcs, []*discoveryv1.EndpointSlice{here}, "n1")
	want := []string{"ns/extip 198.51.100.5", "ns/local-none 203.0.113.1"}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestParsers(t *testing.T) {
	names := map[int]string{2: "eth0", 3: "eth1"}
	route := func(family byte, dstLen byte, attrs func(ae *netlink.AttributeEncoder)) []byte {
		hdr := make([]byte, unix.SizeofRtMsg)
		hdr[0], hdr[1], hdr[4], hdr[7] = family, dstLen, unix.RT_TABLE_MAIN, unix.RTN_UNICAST
		ae := netlink.NewAttributeEncoder()
		attrs(ae)
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return append(hdr, b...)
	}
	def := parseRouteMsg(route(unix.AF_INET, 0, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(unix.RTA_OIF, 2)
		ae.Nested(unix.RTA_METRICS, func(nae *netlink.AttributeEncoder) error { nae.Uint32(unix.RTAX_MTU, 1400); return nil })
	}), names)
	if len(def) != 1 || def[0] != (Route{rules.IPv4, netip.MustParsePrefix("0.0.0.0/0"), "eth0", 1400}) {
		t.Errorf("default route with mtu 1400: %v", def)
	}
	v6 := parseRouteMsg(route(unix.AF_INET6, 64, func(ae *netlink.AttributeEncoder) {
		ae.Bytes(unix.RTA_DST, netip.MustParseAddr("2001:db8:1::").AsSlice())
		ae.Uint32(unix.RTA_OIF, 3)
	}), names)
	if len(v6) != 1 || v6[0] != (Route{rules.IPv6, netip.MustParsePrefix("2001:db8:1::/64"), "eth1", 0}) {
		t.Errorf("IPv6 route: %v", v6)
	}
	ll := parseRouteMsg(route(unix.AF_INET6, 64, func(ae *netlink.AttributeEncoder) {
		ae.Bytes(unix.RTA_DST, netip.MustParseAddr("fe80::").AsSlice())
		ae.Uint32(unix.RTA_OIF, 3)
	}), names)
	if len(ll) != 0 {
		t.Errorf("link-local route kept: %v", ll)
	}
	drops := NoEndpointDrops(`table ip kube-proxy {
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 192.0.2.10 . tcp . 80 comment "shop/web:http" : drop,
			     10.96.0.5 . tcp . 80 comment "shop/api:http" : goto reject-chain }
	}
}`)
	if len(drops) != 1 || drops[0] != "192.0.2.10 tcp/80 (shop/web:http)" {
		t.Errorf("drops: %v", drops)
	}
	if v, ok := promValue("# HELP x\nkubeproxy_iptables_localhost_nodeports_accepted_packets_total 7\nkubeproxy_iptables_localhost_nodeports_accepted_packets_total_x 1\n", "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"); !ok || v != 7 {
		t.Errorf("promValue: %v %v", v, ok)
	}
}

// In the agent a counter is a problem while it rises: the run after one that saw the same counts
// says ok (invalid-replies) and leaves out what did not rise (conntrack-table).
func TestCountersRise(t *testing.T) {
	env := troubled()
	first := Run(context.Background(), env, Checks())
	env = troubled()
	env.Previous = first
	second := Run(context.Background(), env, Checks())
	if f := second.Find("invalid-replies"); f.State != OK || !strings.Contains(f.Summary, "since the last run") {
		t.Errorf("invalid-replies with no rise: %s %q", f.State, f.Summary)
	}
	if f := second.Find("conntrack-table"); f.State != Problem || f.Summary != "the table is 95% full" {
		t.Errorf("conntrack-table with no rise of its counters: %s %q", f.State, f.Summary)
	}
	env = troubled()
	env.Previous = first
	env.Stats = fakeStats{nodestate.ConntrackStats{Invalid: 50, InsertFailed: 3, EarlyDrop: 7, CPUs: 2}}
	if f := Run(context.Background(), env, Checks()).Find("invalid-replies"); f.State != Problem {
		t.Errorf("invalid-replies rising by 8: %s %q", f.State, f.Summary)
	}
}

// The metric has one series per check and state, 1 for the check's state.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg, "nnm_diagnosis_state"); n != 0 {
		t.Errorf("%d series before the first run", n)
	}
	r := Run(context.Background(), troubled(), Checks())
	m.Set(r, 1700000000)
	if n, _ := testutil.GatherAndCount(reg, "nnm_diagnosis_state"); n != len(Checks())*len(States) {
		t.Errorf("%d series, want %d", n, len(Checks())*len(States))
	}
	want := `# HELP nnm_diagnosis_last_run_timestamp_seconds When the diagnose checks last ran in the agent (Unix seconds).
# TYPE nnm_diagnosis_last_run_timestamp_seconds gauge
nnm_diagnosis_last_run_timestamp_seconds 1.7e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "nnm_diagnosis_last_run_timestamp_seconds"); err != nil {
		t.Error(err)
	}
	problems := 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == "problem" {
					problems += s.GetGauge().GetValue()
				}
			}
		}
	}
	if int(problems) != r.Problems {
		t.Errorf("problem series sum to %v, the report has %d", problems, r.Problems)
	}
}

// The golden report of a kube-proxy nftables node that drops an External-IP for want of a local
// endpoint (kubernetes#131765), and has no INVALID drop of its own.
func TestGoldenNFTables(t *testing.T) {
	env := troubled()
	env.ProxyMode, env.Override = "nftables", "no override"
	enable(env, "invalid-drop")
	env.Kernel.(*fakeKernel).nft = map[string]string{
		"table ip kube-proxy": "table ip kube-proxy {\n}\n",
		"map ip kube-proxy no-endpoint-services": `table ip kube-proxy {
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 203.0.113.77 . tcp . 80 comment "shop/ext:tcp" : drop,
			     10.96.0.5 . tcp . 80 comment "shop/api:http" : goto reject-chain }
	}
}
`}
	r := Run(context.Background(), env, []Check{invalidCheck{}, ipvsExternalIPCheck{}, nftNoEndpointCheck{}, migrationCheck{}})
	var text bytes.Buffer
	if err := Text(&text, r); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "testdata/nftables.txt", text.String())
}

// #61: one condition per check, True only for a problem no enabled fix handles, its reason saying
// why; handled, acknowledged and ok are False, cannot tell is Unknown.
func TestConditions(t *testing.T) {
	env := troubled()
	env.Acknowledged = []string{"rp-filter"}
	enable(env, "invalid-drop")
	env.RuleCounters = rulesInKernel{}.counters // invalid-drop enabled, its rules not in the kernel
	env.NoAPI(errors.New("no kubeconfig"))
	got := map[string]string{}
	conds := Conditions(Run(context.Background(), env, Checks()))
	for _, c := range conds {
		got[string(c.Type)] = string(c.Status) + " " + c.Reason
	}
	for typ, want := range map[string]string{
		"ConntrackInvalidResets":   "True FixNotInForce",
		"PathMTUBlackhole":         "True NoEnabledFix",
		"StaleUDPConntrack":        "Unknown CannotTell",
		"StrictReversePathFilter":  "False Acknowledged",
		"NFTablesMigrationBlocked": "False NoProblem",
	} {
		if got[typ] != want {
			t.Errorf("%s: %q, want %q", typ, got[typ], want)
		}
	}
	if len(conds) != len(Checks()) || len(ConditionTypes) != len(Checks()) {
		t.Errorf("%d conditions, %d types, %d checks", len(conds), len(ConditionTypes), len(Checks()))
	}
	if c := Conditions(Run(context.Background(), inForce(troubled()), Checks())); c[0].Reason != "HandledByInvalidDrop" || c[0].Status != "False" {
		t.Errorf("handled: %+v", c[0])
	}
}
