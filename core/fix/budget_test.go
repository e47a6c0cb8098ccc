package fix_test

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
)

// budgetEntries is a per-Service function that wants one entry per port (the port number) at the
// Service's first ingress IP of the family.
func budgetEntries(svc *fix.Service, fam rules.Family, _ int) ([]rules.MapEntry, []fix.Skip) {
	var out []rules.MapEntry
	for _, ing := range svc.Ingress {
		if !fam.Contains(ing.IP) {
			continue
		}
		to := netip.MustParseAddr(map[rules.Family]string{rules.IPv4: "10.96.0.1", rules.IPv6: "fd00:96::1"}[fam])
		for _, p := range svc.Ports {
			out = append(out, rules.MapEntry{Addr: ing.IP, Protocol: rules.TCP, Port: uint16(p.Port), To: netip.AddrPortFrom(to, uint16(p.Port))})
		}
	}
	return out, nil
}

// svcPorts is a Service with n TCP ports 1..n at the given ingress IPs.
func svcPorts(ns, name string, n int, ips ...string) *fix.Service {
	var ports []tk.PortSpec
	for p := range n {
		ports = append(ports, tk.PortSpec{Name: fmt.Sprint("p", p+1), Port: int32(p + 1)})
	}
	return fix.ServiceFrom(tk.Service(ns, name, tk.LoadBalancer(ips...), tk.Ports(ports...)))
}

// skipsOf is the report's skips as "object reason", sorted.
func skipsOf(r fix.ServiceMapResult) []string {
	var out []string
	for _, s := range r.Report.Skipped {
		out = append(out, s.Object+" "+s.Reason)
		if !strings.Contains(s.Detail, "none of them is programmed") {
			panic("a budget skip's detail does not say what happened: " + s.Detail)
		}
	}
	slices.Sort(out)
	return out
}

// TestServiceMapBudget (issue #41 row 2): a Service over PerService is skipped whole, the Services
// of a namespace past PerNamespace and of the map past PerMap (both families together) are skipped
// in namespace/name order, each with its reason and name, and every other Service keeps its
// entries. When an earlier Service grows, a later one is pushed out; when it shrinks, the later one
// is let in again. Each incremental result equals a computation from scratch.
func TestServiceMapBudget(t *testing.T) {
	b := fix.Budget{PerService: 10, PerNamespace: 15, PerMap: 30}
	m := fix.NewServiceMap(budgetEntries).WithBudget(b)
	// From scratch, as the engine runs the units: ipv4 first (the budget decides over both families'
	// entries, whichever comes first: TestServiceMapBudgetWholeService).
	scratch := func(svcs []*fix.Service, fam rules.Family) fix.ServiceMapResult {
		sm := fix.NewServiceMap(budgetEntries).WithBudget(b)
		if fam == rules.IPv6 {
			sm.Update(svcs, rules.IPv4, 0)
		}
		return sm.Update(svcs, fam, 0)
	}
	svcs := []*fix.Service{
		svcPorts("a", "big", 11, "203.0.113.1"),     // over PerService
		svcPorts("a", "one", 8, "203.0.113.2"),      // a: 8
		svcPorts("a", "two", 8, "203.0.113.3"),      // a: 16 > 15: namespace budget
		svcPorts("a", "three", 7, "203.0.113.4"),    // a: 15
		svcPorts("b", "one", 10, "203.0.113.5"),     // map: 25
		svcPorts("c", "one", 6, "203.0.113.6"),      // map: 31 > 30: fix budget
		svcPorts("c", "small", 5, "203.0.113.7"),    // map: 30
		svcPorts("d", "v6", 4, "2001:db8::1"),       // ipv6 only
		svcPorts("d", "zz", 0, "203.0.113.8"),       // no entries: never a budget skip
		svcPorts("a", "nine", 10, "203.0.113.9"),    // sorted between a/big and a/one
		svcPorts("c", "alpha", 1, "203.0.113.10"),   // c/alpha before c/one
		svcPorts("b", "aaaa", 0, "203.0.113.11"),    // nothing
		svcPorts("e", "late", 1, "203.0.113.12"),    // after the map is full
		svcPorts("a", "a-first", 3, "203.0.113.13"), // a: 3
	}
	tk.SortServices(svcs)
	check := func(what string, fam rules.Family, wantEntries int, wantSkips ...string) {
		t.Helper()
		got := m.Update(svcs, fam, 0)
		slices.Sort(wantSkips)
		if len(got.Entries) != wantEntries || !slices.Equal(skipsOf(got), wantSkips) {
			t.Errorf("%s (%s): %d entries, skips %q; want %d, %q", what, fam, len(got.Entries), skipsOf(got), wantEntries, wantSkips)
		}
		if s := scratch(svcs, fam); fmt.Sprint(s.Entries) != fmt.Sprint(got.Entries) || fmt.Sprint(skipsOf(s)) != fmt.Sprint(skipsOf(got)) {
			t.Errorf("%s (%s): incremental result differs from scratch:\n%v %q\n%v %q", what, fam, got.Entries, skipsOf(got), s.Entries, skipsOf(s))
		}
	}
	// a: a-first 3, big over, nine 10 (13), one 8 (21 > 15: over), three 7 (20: over), two 8 (over).
	// b: one 10 (map 23). c: alpha 1 (24), one 6 (30), small 5 (35 > 30: over). e/late 1 (31: over).
	check("cold", rules.IPv4, 30,
		"a/big service-budget", "a/one namespace-budget", "a/three namespace-budget", "a/two namespace-budget",
		"c/small fix-budget", "e/late fix-budget")
	// The ipv6 map has only d/v6, but the map's budget is shared: the Services before it hold all 30.
	check("the other family, budget used up", rules.IPv6, 0, "d/v6 fix-budget")

	// a/nine shrinks to 2: a/one (8, a: 13) gets in, then a/three (7, a: 20) does not; the map has
	// 3+2+8+10+1+6 = 30, so c/small stays out.
	for i, s := range svcs {
		if s.Key() == "a/nine" {
			svcs[i] = svcPorts("a", "nine", 2, "203.0.113.9")
		}
	}
	check("an earlier Service shrank", rules.IPv4, 30,
		"a/big service-budget", "a/three namespace-budget", "a/two namespace-budget", "c/small fix-budget", "e/late fix-budget")

	// b/one leaves: c/small (5) and e/late (1) fit again (map 3+2+8+1+6+5+1 = 26).
	svcs = slices.DeleteFunc(svcs, func(s *fix.Service) bool { return s.Key() == "b/one" })
	check("a Service left", rules.IPv4, 26, "a/big service-budget", "a/three namespace-budget", "a/two namespace-budget")
	// ipv6 now finds room (30 - 26 = 4): d/v6 is let in at its next update.
	check("the other family, room again", rules.IPv6, 4)
}

// TestOverServiceBudget: the bound a per-Service function checks before making its entries is
// MaxEntriesPerService.
func TestOverServiceBudget(t *testing.T) {
	if _, over := fix.OverServiceBudget(fix.MaxEntriesPerService); over {
		t.Error("MaxEntriesPerService entries are over the budget")
	}
	if s, over := fix.OverServiceBudget(fix.MaxEntriesPerService + 1); !over || s.Reason != fix.ReasonServiceBudget {
		t.Errorf("one entry more: %+v, %v", s, over)
	}
}

// TestServiceMapBudgetWholeService: a dual-stack Service is let in or refused in every family
// alike, decided in namespace/name order over its entries of all families, whatever family the
// engine computes first: never programmed in one family and refused in the other, and never one
// family taking the map's budget from the Services before it in the other.
func TestServiceMapBudgetWholeService(t *testing.T) {
	b := fix.Budget{PerService: 10, PerNamespace: 12, PerMap: 20}
	// In namespace/name order: a/one 4+4 (a: 4 and 4, map 8), a/three 3+3 (a: 7 and 7, map 14),
	// a/two 6 in ipv4 (a: 13 > 12, refused), b/one 4+4 (map 22 > 20, refused in both), b/two 5 in
	// ipv6 (map 19), c/one 2 in ipv6 (map 21 > 20, refused).
	svcs := []*fix.Service{
		svcPorts("a", "one", 4, "203.0.113.1", "2001:db8::1"),
		svcPorts("a", "two", 6, "203.0.113.2"),
		svcPorts("a", "three", 3, "203.0.113.3", "2001:db8::3"),
		svcPorts("b", "one", 4, "203.0.113.4", "2001:db8::4"),
		svcPorts("b", "two", 5, "2001:db8::5"),
		svcPorts("c", "one", 2, "2001:db8::6"),
	}
	tk.SortServices(svcs)
	want := map[rules.Family][]string{
		rules.IPv4: {"a/two namespace-budget", "b/one fix-budget"},
		rules.IPv6: {"b/one fix-budget", "c/one fix-budget"},
	}
	wantEntries := map[rules.Family]int{rules.IPv4: 7, rules.IPv6: 12}
	for _, order := range [][]rules.Family{{rules.IPv4, rules.IPv6}, {rules.IPv6, rules.IPv4}} {
		m := fix.NewServiceMap(budgetEntries).WithBudget(b)
		got := map[rules.Family]fix.ServiceMapResult{}
		for _, fam := range order {
			got[fam] = m.Update(svcs, fam, 0)
		}
		for _, fam := range order { // the family computed first, again: its result agrees now
			got[fam] = m.Update(svcs, fam, 0)
		}
		for fam, r := range got {
			if len(r.Entries) != wantEntries[fam] || !slices.Equal(skipsOf(r), want[fam]) {
				t.Errorf("order %v, %s: %d entries, skips %q; want %d, %q", order, fam, len(r.Entries), skipsOf(r), wantEntries[fam], want[fam])
			}
		}
	}
}

// TestServiceMapBudgetOf: the budget is read at every Update (the backend in use can change): a
// smaller one refuses the Services past it at the next Update, though the Services did not change.
func TestServiceMapBudgetOf(t *testing.T) {
	b := fix.Budget{PerService: 10, PerNamespace: 20, PerMap: 20}
	m := fix.NewServiceMap(budgetEntries).WithBudgetOf(func() fix.Budget { return b })
	svcs := []*fix.Service{svcPorts("a", "one", 8, "203.0.113.1"), svcPorts("b", "one", 8, "203.0.113.2")}
	if got := m.Update(svcs, rules.IPv4, 0); len(got.Entries) != 16 || len(got.Report.Skipped) != 0 {
		t.Fatalf("budget 20: %d entries, skips %q", len(got.Entries), skipsOf(got))
	}
	b.PerMap = 10
	if got := m.Update(svcs, rules.IPv4, 0); len(got.Entries) != 8 || !slices.Equal(skipsOf(got), []string{"b/one fix-budget"}) {
		t.Errorf("budget 10: %d entries, skips %q; want 8, b/one refused", len(got.Entries), skipsOf(got))
	}
}

// TestBudgetFor: the iptables backend's budget is what fits the memory limit at its measured cost;
// an unknown backend (the test fake) gets DefaultBudget; the namespace budget is at most half of
// the fix's.
func TestBudgetFor(t *testing.T) {
	if got := fix.BudgetFor("fake", 0); got != fix.DefaultBudget {
		t.Errorf("unknown backend: %+v, want DefaultBudget", got)
	}
	for _, be := range []string{"iptables", "nftables"} {
		b := fix.BudgetFor(be, 0)
		if b.PerMap != fix.MaxEntriesPerFixFor(be) || b.PerMap <= 0 || b.PerMap > fix.MaxEntriesPerFix || b.PerNamespace > b.PerMap/2 || b.PerService > b.PerNamespace {
			t.Errorf("%s: %+v", be, b)
		}
	}
	if fix.MaxEntriesPerFixFor("nftables") != fix.MaxEntriesPerFix {
		t.Errorf("nftables: %d, want MaxEntriesPerFix", fix.MaxEntriesPerFixFor("nftables"))
	}
	if ipt := fix.MaxEntriesPerFixFor("iptables"); ipt >= fix.MaxEntriesPerFix {
		t.Errorf("iptables: %d entries; its rules cost the cgroup more than 128Mi at MaxEntriesPerFix", ipt)
	}
}

// TestBudgetFollowsTheMemoryLimit: the fix's budget at the DaemonSet's limit is the measured one
// (also when the limit is given); a higher limit gives more entries and a lower one fewer, in
// proportion to what the limit holds above the backend's base memory; a limit whose three quarters
// do not exceed that base gives none (every Service is then a fix-budget skip); a backend without
// measured figures keeps its budget whatever the limit.
func TestBudgetFollowsTheMemoryLimit(t *testing.T) {
	const mi = 1 << 20
	for _, be := range []string{"iptables", "nftables"} {
		at := func(limit int64) int { return fix.BudgetFor(be, limit).PerMap }
		measured := fix.MaxEntriesPerFixFor(be)
		if at(0) != measured || at(fix.MemoryLimit) != measured {
			t.Errorf("%s: %d entries at the default limit, %d at 128Mi given; want %d", be, at(0), at(fix.MemoryLimit), measured)
		}
		prev := 0
		for _, limit := range []int64{32 * mi, 48 * mi, 64 * mi, 96 * mi, 127 * mi, 129 * mi, 256 * mi, 512 * mi, 1 << 40, 1 << 62, math.MaxInt64} {
			n := at(limit)
			if n < prev || n%100 != 0 || (limit < fix.MemoryLimit) != (n < measured) {
				t.Errorf("%s: %d entries at %d MiB after %d at a lower limit; want a multiple of 100 that grows with the limit, below %d exactly under 128Mi", be, n, limit/mi, prev, measured)
			}
			b := fix.BudgetFor(be, limit)
			if b.PerNamespace > b.PerMap/2 || b.PerService > b.PerNamespace || b.PerService > fix.MaxEntriesPerService {
				t.Errorf("%s at %d MiB: %+v", be, limit/mi, b)
			}
			prev = n
		}
		if n := at(32 * mi); n != 0 {
			t.Errorf("%s: %d entries at 32Mi, whose three quarters (24 MiB) hold no more than the agent itself", be, n)
		}
		// Twice the limit holds more than twice the entries: the base is paid once.
		if n := at(2 * fix.MemoryLimit); n < 2*measured {
			t.Errorf("%s: %d entries at 256Mi, want at least %d", be, n, 2*measured)
		}
	}
	if got := fix.BudgetFor("fake", 32<<20); got != fix.DefaultBudget {
		t.Errorf("unknown backend at 32Mi: %+v, want DefaultBudget", got)
	}
}
