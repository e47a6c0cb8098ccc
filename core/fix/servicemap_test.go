package fix_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
)

// TestServiceMapRecomputesOnlyChanged counts the per-Service calls: none when nothing changed (and
// the same entries are returned), one per added Service, one per deleted one and two per changed
// one (ServiceMap keeps no entries per Service: those of the object that leaves are computed again
// to release them), one more per Service that lost a conflict and was not computed in that call
// (its skip is reported again), every Service when the inputs change. The equality with a computation from scratch is fixes.TestIncrementalEqualsScratch.
func TestServiceMapRecomputesOnlyChanged(t *testing.T) {
	calls := 0
	m := fix.NewServiceMap(func(svc *fix.Service, fam rules.Family, port uint16) ([]rules.MapEntry, []fix.Skip) {
		calls++
		a := svc.Ingress[0].IP
		return []rules.MapEntry{{Addr: a, Protocol: rules.TCP, Port: port, To: netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), port)}}, nil
	})
	lb := func(ns, name, ip string) *fix.Service {
		return fix.ServiceFrom(tk.Service(ns, name, tk.LoadBalancer(ip)))
	}
	var svcs []*fix.Service
	for i := range 1000 {
		svcs = append(svcs, lb("default", fmt.Sprintf("s%04d", i), fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)))
	}
	check := func(what string, in uint16, wantCalls, wantEntries int) fix.ServiceMapResult {
		t.Helper()
		calls = 0
		r := m.Update(svcs, rules.IPv4, in)
		if calls != wantCalls || len(r.Entries) != wantEntries || r.Report.Covered != wantEntries {
			t.Fatalf("%s: %d per-Service calls and %d entries (%d covered), want %d and %d", what, calls, len(r.Entries), r.Report.Covered, wantCalls, wantEntries)
		}
		return r
	}
	first := check("cold", 80, 1000, 1000)
	again := check("nothing changed", 80, 0, 1000)
	if &first.Entries[0] != &again.Entries[0] {
		t.Fatal("nothing changed but the entries were rebuilt")
	}
	svcs[500] = lb("default", "s0500", "192.0.2.1")
	r := check("one changed", 80, 2, 1000)
	if r.Entries[len(r.Entries)-1].Addr != netip.MustParseAddr("192.0.2.1") || first.Entries[500].Addr != netip.MustParseAddr("172.16.2.1") {
		t.Fatalf("the changed entry is not last in address order, or the earlier result was modified")
	}
	svcs = append(svcs[:10], svcs[11:]...)
	check("one deleted", 80, 1, 999)
	svcs = append(svcs, lb("z", "conflict", "192.0.2.1"))
	r = check("one added, in conflict", 80, 1, 999)
	if n := len(r.Report.Skipped); n != 1 || r.Report.Skipped[0].Reason != fix.ReasonConflict || r.Report.Skipped[0].Object != "z/conflict" {
		t.Fatalf("want one conflict skip of z/conflict, got %+v", r.Report.Skipped)
	}
	svcs = append(svcs[:20], svcs[21:]...)
	r = check("one deleted, a conflict standing", 80, 2, 998)
	if n := len(r.Report.Skipped); n != 1 || r.Report.Skipped[0].Object != "z/conflict" {
		t.Fatalf("the standing conflict is not reported: %+v", r.Report.Skipped)
	}
	check("other inputs", 8080, 999, 998)
}

// TestServiceMapUnsortedInput: Services out of namespace/name order, and a name given twice (the
// first object counts), give what the sorted list gives, in a first call and in a later one that
// recognises most Services by pointer.
func TestServiceMapUnsortedInput(t *testing.T) {
	perService := func(svc *fix.Service, fam rules.Family, _ int) ([]rules.MapEntry, []fix.Skip) {
		a := svc.Ingress[0].IP
		return []rules.MapEntry{{Addr: a, Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), 80)}}, nil
	}
	lb := func(name, ip string) *fix.Service {
		return fix.ServiceFrom(tk.Service("default", name, tk.LoadBalancer(ip)))
	}
	var sorted []*fix.Service
	for i := range 20 {
		sorted = append(sorted, lb(fmt.Sprintf("s%02d", i), fmt.Sprintf("172.16.0.%d", i+1)))
	}
	twin := lb("s07", "192.0.2.7") // same name as sorted[7], given after it: ignored
	want := fix.NewServiceMap(perService).Update(sorted, rules.IPv4, 0)

	m := fix.NewServiceMap(perService)
	shuffled := func() []*fix.Service {
		out := append([]*fix.Service{}, sorted[10:]...)
		out = append(out, sorted[:10]...)
		return append(out, twin) // after sorted[7]: stable sorting keeps sorted[7] first
	}
	for _, call := range []string{"first", "second"} {
		in := shuffled()
		got := m.Update(in, rules.IPv4, 0)
		if fmt.Sprint(got.Entries) != fmt.Sprint(want.Entries) || got.Report.Covered != want.Report.Covered {
			t.Fatalf("%s call: unsorted input gave %v (%d covered), sorted %v (%d)", call, got.Entries, got.Report.Covered, want.Entries, want.Report.Covered)
		}
		if in[0] != sorted[10] {
			t.Fatalf("%s call: the caller's slice was reordered", call)
		}
	}
	// A sorted list with a duplicate after the Services kept by pointer: the first object counts.
	withTwin := append(append(append([]*fix.Service{}, sorted[:8]...), twin), sorted[8:]...)
	if got := m.Update(withTwin, rules.IPv4, 0); fmt.Sprint(got.Entries) != fmt.Sprint(want.Entries) {
		t.Fatalf("a duplicate name after kept Services changed the map: %v", got.Entries)
	}
}

// TestServiceMapChangeAllocations: a change of one Service among many allocates a fixed number of
// objects, whatever the number of Services: the budget's pass over every Service builds no key
// and no skip for a Service it admits (it did, 2 allocations per Service: 20,000 a change at
// 10,000 Services). The map's new entries are one slice of them all (the earlier result is never
// modified), so the bytes do grow; the objects do not.
func TestServiceMapChangeAllocations(t *testing.T) {
	perService := func(svc *fix.Service, fam rules.Family, _ int) ([]rules.MapEntry, []fix.Skip) {
		a := svc.Ingress[0].IP
		return []rules.MapEntry{{Addr: a, Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(netip.MustParseAddr("10.96.0.1"), 80)}}, nil
	}
	allocs := func(n int) float64 {
		var svcs []*fix.Service
		for i := range n {
			svcs = append(svcs, fix.ServiceFrom(tk.Service("default", fmt.Sprintf("s%05d", i), tk.LoadBalancer(fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)))))
		}
		m := fix.NewServiceMap(perService)
		m.Update(svcs, rules.IPv4, 0)
		a, b := fix.ServiceFrom(tk.Service("default", "s00007", tk.LoadBalancer("192.0.2.1"))), svcs[7]
		return testing.AllocsPerRun(20, func() {
			svcs[7], a, b = a, b, a
			m.Update(svcs, rules.IPv4, 0)
		})
	}
	small, large := allocs(100), allocs(5000)
	if large > small+10 {
		t.Fatalf("a one-Service change allocates %.0f objects among 5,000 Services and %.0f among 100: the pass over every Service allocates", large, small)
	}
	t.Logf("a one-Service change: %.0f allocations among 100 Services, %.0f among 5,000", small, large)
}
