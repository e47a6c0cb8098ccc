package diagnose

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/fixes/mssclamp"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// The labs: each reproduces a check's condition in network namespaces of its own, on the real
// kernel, and runs the real readers (RealKernel, /proc/sys, ctnetlink) inside the node namespace:
// the check names the condition; with its fix enabled it says "handled by"; on a clean lab it names
// nothing.

var fixIDs = []string{fixInvalidDrop, fixLiberal, fixIPVS, fixMSSClamp, fixStaleUDP}

// labEnv is the Env of a node namespace: the real readers, no fix enabled except those in on, whose
// last sync succeeded as a running agent would report it; the rule fixes' rules are read from the
// kernel by the nftables backend (labRules puts them there).
func labEnv(mode string, on ...string) *Env {
	be, err := nftables.New(nftables.Options{Logger: slog.Default()})
	if err != nil {
		panic(err)
	}
	env := &Env{Node: "n1", ProxyMode: mode, IptablesVariant: "nft", Sysctl: &nodestate.ProcSysctl{},
		Conntrack: nodestate.NewConntrack(), Stats: nodestate.NewConntrack(), Kernel: RealKernel{}, Missing: map[string]string{},
		Options: map[string]map[string]any{}, Families: []rules.Family{rules.IPv4},
		RuleCounters: BackendCounters(be), Agent: "a lab agent"}
	for _, id := range fixIDs {
		fs := FixState{ID: id}
		if slices.Contains(on, id) {
			fs.Enabled, fs.Sync = true, &SyncState{OK: true, LastOK: time.Now()}
		}
		env.Fixes = append(env.Fixes, fs)
	}
	return env
}

// labRules applies a rule fix's rules for a node with pod CIDR 10.244.1.0/24 in ns, IPv4, with
// the nftables backend, as the agent's sync would.
func labRules[F fix.RuleFix](t *testing.T, ns *netns.NS, newFix func(fix.Params) (F, error)) {
	t.Helper()
	be, err := nftables.New(nftables.Options{Logger: slog.Default()})
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFix(fix.Params{Backend: be, Sysctl: nodestate.NewFakeSysctl(nil), Conntrack: nodestate.NewFakeConntrack()})
	if err != nil {
		t.Fatal(err)
	}
	snap := fix.NewSnapshot(fix.Env{NodeName: "n1"}, nil)
	inputs.PodCIDRs.Set(snap, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")})
	rs, _, err := f.Rules(snap, rules.IPv4)
	if err != nil || rs == nil {
		t.Fatalf("%s rules: %v %v", f.ID(), rs, err)
	}
	if err := ns.Do(func() error { return testkit.Apply(t.Context(), be, rs) }); err != nil {
		t.Fatal(err)
	}
}

// runIn runs check in ns with env and returns its finding.
func runIn(t *testing.T, ns *netns.NS, env *Env, check Check) Finding {
	t.Helper()
	var r *Report
	if err := ns.Do(func() error { r = Run(context.Background(), env, []Check{check}); return nil }); err != nil {
		t.Fatal(err)
	}
	f := r.Findings[0]
	t.Logf("%s: %s (%s) %v", f.Check, f.State, f.Summary, f.Evidence)
	return f
}

func wantState(t *testing.T, what string, f Finding, state State, by string) {
	t.Helper()
	if f.State != state || f.HandledBy != by {
		t.Errorf("%s: %s %s (%s), want %s %s", what, f.State, f.HandledBy, f.Summary, state, by)
	}
}

// Lab invalid-replies: the connection-reset reproduction of kubernetes#74839 (resettest: pod, node,
// external namespaces; an out-of-window segment from the server). After it, the node's conntrack
// has counted INVALID packets: diagnose names the problem; with invalid-drop enabled, "handled by
// invalid-drop"; a node namespace where only clean traffic flowed names nothing.
func TestLabInvalidReplies(t *testing.T) {
	netns.Require(t, "nft", "conntrack")
	tp := resettest.New(t)
	clean := runIn(t, tp.Node, labEnv("iptables"), invalidCheck{})
	wantState(t, "before the out-of-window segment", clean, OK, "")
	in := resettest.Inject(t, tp, resettest.V4, true)
	if err := in.Reproduced(); err != nil {
		t.Fatalf("the reset was not reproduced: %v", err)
	}
	wantState(t, "after the out-of-window segment", runIn(t, tp.Node, labEnv("iptables"), invalidCheck{}), Problem, "")
	// #61: "handled" is judged from the kernel and the last sync, not from the configuration.
	f := runIn(t, tp.Node, labEnv("iptables", fixInvalidDrop), invalidCheck{})
	wantState(t, "invalid-drop enabled, none of its rules in the kernel", f, Problem, "")
	if !strings.Contains(f.Summary, "invalid-drop is enabled and its last sync succeeded, but its rules are not in the kernel") {
		t.Errorf("the summary does not say what is missing: %s", f.Summary)
	}
	failing := labEnv("iptables", fixInvalidDrop)
	failing.Fixes[0].Sync = &SyncState{Error: "ipv4: iptables-restore: Another app is currently holding the xtables lock"}
	if f := runIn(t, tp.Node, failing, invalidCheck{}); f.State != Problem || !strings.Contains(f.Summary, "its last sync failed: ipv4: iptables-restore: Another app") {
		t.Errorf("invalid-drop failing: %s %s", f.State, f.Summary)
	}
	labRules(t, tp.Node, invaliddrop.New)
	wantState(t, "with invalid-drop's rules", runIn(t, tp.Node, labEnv("iptables", fixInvalidDrop), invalidCheck{}), Handled, fixInvalidDrop)
	f = runIn(t, tp.Node, labEnv("iptables", fixLiberal), invalidCheck{})
	wantState(t, "conntrack-liberal enabled, the sysctl still 0", f, Problem, "")
	if !strings.Contains(f.Summary, "nf_conntrack_tcp_be_liberal is 0, not 1") {
		t.Errorf("the summary does not name the sysctl: %s", f.Summary)
	}
	tp.Node.MustExec("sysctl", "-qw", nodestate.ConntrackTCPBeLiberal+"=1")
	wantState(t, "with conntrack-liberal", runIn(t, tp.Node, labEnv("iptables", fixLiberal), invalidCheck{}), Handled, fixLiberal)
	wantState(t, "with nf_conntrack_tcp_be_liberal=1 set by someone else", runIn(t, tp.Node, labEnv("iptables"), invalidCheck{}), OK, "")
}

// pmtuLab is pod — node — router: the pod link is 1500 bytes, the node's uplink mtu.
func pmtuLab(t *testing.T, uplinkMTU int) *netns.NS {
	node, pod, router := netns.NewNoDAD(t, "nnmdg-node"), netns.NewNoDAD(t, "nnmdg-pod"), netns.NewNoDAD(t, "nnmdg-rtr")
	node.Veth("pod0", pod, "eth0")
	node.Veth("ext0", router, "eth0")
	node.AddAddrs("pod0", "10.244.1.1/24", "fd00:10:244:1::1/64")
	pod.AddAddrs("eth0", "10.244.1.2/24", "fd00:10:244:1::2/64")
	node.AddAddrs("ext0", "192.0.2.1/24", "2001:db8:1::1/64")
	router.AddAddrs("eth0", "192.0.2.2/24", "2001:db8:1::2/64")
	node.MustExec("ip", "link", "set", "ext0", "mtu", fmt.Sprint(uplinkMTU))
	node.MustExec("ip", "route", "add", "default", "via", "192.0.2.2")
	return node
}

// Lab pmtu: a 1400-byte uplink behind 1500-byte pod links (mss-clamp's TestKernelBlackHole
// topology) is named; with mss-clamp enabled, handled; all links at 1500, nothing.
func TestLabPMTU(t *testing.T) {
	netns.Require(t, "ip")
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	narrow := pmtuLab(t, 1400)
	env := labEnv("iptables")
	env.PodCIDRs = cidrs
	f := runIn(t, narrow, env, pmtuCheck{})
	wantState(t, "1400-byte uplink", f, Problem, "")
	if !strings.Contains(f.Summary, "ext0 mtu 1400") {
		t.Errorf("the narrow link is not named: %s", f.Summary)
	}
	env = labEnv("iptables", fixMSSClamp)
	env.PodCIDRs = cidrs
	wantState(t, "1400-byte uplink, mss-clamp enabled, its rules not in the kernel", runIn(t, narrow, env, pmtuCheck{}), Problem, "")
	labRules(t, narrow, mssclamp.New)
	wantState(t, "1400-byte uplink, mss-clamp", runIn(t, narrow, env, pmtuCheck{}), Handled, fixMSSClamp)
	// #61: a fixed mss larger than the narrow route carries is no clamp.
	env.Options[fixMSSClamp] = map[string]any{"mss": 8000}
	f = runIn(t, narrow, env, pmtuCheck{})
	wantState(t, "mss-clamp with a fixed mss 8000 over a 1400-byte uplink", f, Problem, "")
	if !strings.Contains(f.Summary, "fixed mss 8000, above the 1340") {
		t.Errorf("the summary does not name the mss: %s", f.Summary)
	}
	env = labEnv("iptables")
	env.PodCIDRs = cidrs
	wantState(t, "1500-byte uplink", runIn(t, pmtuLab(t, 1500), env, pmtuCheck{}), OK, "")
	// #61: the route's mtu counts, not only the link's: pods and uplink at 9000, the default route at 1400.
	jumbo := pmtuLab(t, 9000)
	jumbo.MustExec("ip", "link", "set", "pod0", "mtu", "9000")
	jumbo.MustExec("ip", "route", "replace", "default", "via", "192.0.2.2", "mtu", "1400")
	f = runIn(t, jumbo, env, pmtuCheck{})
	wantState(t, "links at 9000, default route mtu 1400", f, Problem, "")
	if !strings.Contains(f.Summary, "default dev ext0 mtu 1400 (route; link 9000)") {
		t.Errorf("the route is not named: %s", f.Summary)
	}
	env = labEnv("iptables")
	env.PodCIDRsWhy = "no API access"
	wantState(t, "no pod CIDR known", runIn(t, narrow, env, pmtuCheck{}), CannotTell, "")
}

// Lab rp-filter: strict rp_filter on the pod link is named (report only), loose is not.
func TestLabRPFilter(t *testing.T) {
	netns.Require(t, "ip", "sysctl")
	node := pmtuLab(t, 1500)
	env := labEnv("iptables")
	env.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
	node.MustExec("sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.pod0.rp_filter=1", "net.ipv4.conf.ext0.rp_filter=2")
	f := runIn(t, node, env, rpFilterCheck{})
	wantState(t, "strict on pod0", f, Problem, "")
	if !f.ReportOnly || !strings.HasSuffix(f.Summary, "on pod0") {
		t.Errorf("want report-only naming pod0 only: %+v", f)
	}
	node.MustExec("sysctl", "-qw", "net.ipv4.conf.pod0.rp_filter=2")
	wantState(t, "loose everywhere", runIn(t, node, env, rpFilterCheck{}), OK, "")
}

// Lab stale-udp: UDP entries DNATed (as portmap's DNAT makes them) to a pod address of the node's
// pod CIDR that no Pod holds are counted, with examples: those stale-udp-conntrack would delete;
// entries to the live Pod and to another node's pod are not. With the fix enabled, handled; with
// only live targets, nothing.
func TestLabStaleUDP(t *testing.T) {
	netns.Require(t, "conntrack")
	ns := netns.New(t, "nnmdg-ct")
	entries := []ctfill.Entry{
		{Protocol: syscall.IPPROTO_UDP, Src: netip.MustParseAddrPort("192.0.2.50:40000"), Dst: netip.MustParseAddrPort("192.0.2.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.9:8125")},
		{Protocol: syscall.IPPROTO_UDP, Src: netip.MustParseAddrPort("192.0.2.50:40001"), Dst: netip.MustParseAddrPort("192.0.2.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.9:8125")},
		{Protocol: syscall.IPPROTO_UDP, Src: netip.MustParseAddrPort("[2001:db8::50]:40000"), Dst: netip.MustParseAddrPort("[2001:db8::1]:8125"), DNATTo: netip.MustParseAddrPort("[fd00:10:244:1::9]:8125")},
		{Protocol: syscall.IPPROTO_UDP, Src: netip.MustParseAddrPort("192.0.2.51:40000"), Dst: netip.MustParseAddrPort("192.0.2.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.5:8125")},
		{Protocol: syscall.IPPROTO_UDP, Src: netip.MustParseAddrPort("10.244.1.5:5000"), Dst: netip.MustParseAddrPort("10.96.0.10:53"), DNATTo: netip.MustParseAddrPort("10.244.2.3:53")},
		{Protocol: syscall.IPPROTO_TCP, Src: netip.MustParseAddrPort("192.0.2.52:40000"), Dst: netip.MustParseAddrPort("192.0.2.1:80"), DNATTo: netip.MustParseAddrPort("10.244.1.9:80")},
	}
	if err := ns.Do(func() error { return ctfill.Create(len(entries), func(i int) ctfill.Entry { return entries[i] }) }); err != nil {
		t.Fatal(err)
	}
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "mon", Name: "statsd"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}}}}
	mk := func(on ...string) *Env {
		env := labEnv("iptables", on...)
		env.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
		env.Cluster = fix.NewSnapshot(fix.Env{NodeName: "n1"}, nil)
		inputs.Pods.Set(env.Cluster, []*corev1.Pod{live})
		return env
	}
	f := runIn(t, ns, mk(), staleUDPCheck{})
	wantState(t, "entries to 10.244.1.9 and fd00:10:244:1::9", f, Problem, "")
	if !strings.HasPrefix(f.Summary, "3 UDP entries") {
		t.Errorf("want 3 stale entries (two IPv4, one IPv6): %s", f.Summary)
	}
	wantState(t, "with stale-udp-conntrack", runIn(t, ns, mk(fixStaleUDP), staleUDPCheck{}), Handled, fixStaleUDP)
	// The dead pod's address is held again: nothing is stale.
	env := mk()
	reborn := live.DeepCopy()
	reborn.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.9"}, {IP: "fd00:10:244:1::9"}}
	inputs.Pods.Set(env.Cluster, []*corev1.Pod{live, reborn})
	wantState(t, "every target held", runIn(t, ns, env, staleUDPCheck{}), OK, "")
}

// Lab conntrack-table and neighbour-table (report only): real entries and real neighbours, counted
// against limits that a network namespace cannot lower (nf_conntrack_max and gc_thresh3 are set in
// the initial namespace only): the limits come from a sysctl view over the real one.
func TestLabTables(t *testing.T) {
	netns.Require(t, "ip", "conntrack")
	node := pmtuLab(t, 1500)
	for i := 10; i < 40; i++ {
		node.MustExec("ip", "neigh", "add", fmt.Sprintf("10.244.1.%d", i), "lladdr", fmt.Sprintf("02:00:00:00:00:%02x", i), "dev", "pod0", "nud", "permanent")
	}
	if err := node.Do(func() error {
		return ctfill.Create(50, func(i int) ctfill.Entry {
			return ctfill.Entry{Protocol: syscall.IPPROTO_UDP, Src: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.60"), uint16(20000+i)), Dst: netip.MustParseAddrPort("192.0.2.1:53")}
		})
	}); err != nil {
		t.Fatal(err)
	}
	limits := func(ctMax, thresh3 string) *Env {
		env := labEnv("iptables")
		env.Sysctl = &overlay{real: &nodestate.ProcSysctl{}, values: map[string]string{
			"net.netfilter.nf_conntrack_max":    ctMax,
			"net.ipv4.neigh.default.gc_thresh1": "16", "net.ipv6.neigh.default.gc_thresh1": "16",
			"net.ipv4.neigh.default.gc_thresh2": "24", "net.ipv6.neigh.default.gc_thresh2": "24",
			"net.ipv4.neigh.default.gc_thresh3": thresh3, "net.ipv6.neigh.default.gc_thresh3": thresh3}}
		return env
	}
	wantState(t, "50 entries of 52", runIn(t, node, limits("52", "1024"), conntrackFillCheck{}), Problem, "")
	wantState(t, "50 entries of 262144", runIn(t, node, limits("262144", "1024"), conntrackFillCheck{}), OK, "")
	wantState(t, "30 neighbours of 32", runIn(t, node, limits("262144", "32"), neighbourCheck{}), Problem, "")
	wantState(t, "30 neighbours of 1024", runIn(t, node, limits("262144", "1024"), neighbourCheck{}), OK, "")
}

// overlay answers some sysctls itself and reads the others from real.
type overlay struct {
	real   nodestate.Sysctl
	values map[string]string
}

func (o *overlay) Get(name string) (string, error) {
	if v, ok := o.values[name]; ok {
		return v, nil
	}
	return o.real.Get(name)
}
func (o *overlay) Set(string, string) error { return fmt.Errorf("read only") }
