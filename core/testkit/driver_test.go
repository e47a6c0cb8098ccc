package testkit_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
)

// The fake runs the production Driver over operations that take each of its branches; these tests
// drive them through a fix's FixEnv, as any fix test can.

// rulesOf returns invalid-drop's IPv4 rules with options.
func rulesOf(t *testing.T, options map[string]any) *rules.Ruleset {
	t.Helper()
	e := testkit.NewFixEnv(t, invaliddrop.New, options)
	rs, _ := e.Sync(nil, rules.IPv4)
	return rs
}

// Generation branch: with the fake's generation a Verify while nothing else committed reads
// nothing back; a commit by someone else (Tamper) moves it, and the next Verify reads and repairs.
func TestFakeGenerationProvesUnchanged(t *testing.T) {
	e := testkit.NewFixEnv(t, invaliddrop.New, nil)
	e.Backend.UseGeneration()
	rs, _ := e.Sync(nil, rules.IPv4)
	reads, applies := e.Backend.ReadBacks(), e.Backend.ApplyCalls()
	e.Sync(nil, rules.IPv4) // a Verify
	if e.Backend.ReadBacks() != reads || e.Backend.ApplyCalls() != applies {
		t.Fatalf("a Verify with the generation unmoved read back %d times and applied %d times; want 0 and 0",
			e.Backend.ReadBacks()-reads, e.Backend.ApplyCalls()-applies)
	}
	e.Backend.Tamper(invaliddrop.ID, rules.IPv4)
	res, err := testkit.Verify(context.Background(), e.Backend, rs)
	if err != nil || !res.Repaired || !res.ReadBack || e.Backend.ReadBacks() != reads+1 {
		t.Fatalf("a Verify after someone else's commit: %+v, %v (read-backs %d); want it read back and repaired", res, err, e.Backend.ReadBacks()-reads)
	}
	without := testkit.NewFixEnv(t, invaliddrop.New, nil)
	without.Sync(nil, rules.IPv4)
	reads = without.Backend.ReadBacks()
	without.Sync(nil, rules.IPv4)
	if without.Backend.ReadBacks() != reads+1 {
		t.Fatal("without a generation a Verify must read back")
	}
}

// Stale-record branch: a change built from the record (Trust) that finds the objects changed behind
// it is refused as stale, and the Driver applies in full; the result is what was asked for, and the
// record then matches.
func TestFakeStaleRecordIsAppliedInFull(t *testing.T) {
	ctx := context.Background()
	e := testkit.NewFixEnv(t, invaliddrop.New, nil)
	e.Sync(nil, rules.IPv4)
	e.Backend.Tamper(invaliddrop.ID, rules.IPv4)
	want := rulesOf(t, map[string]any{"protocols": []any{"tcp"}})
	applies := e.Backend.ApplyCalls()
	if err := testkit.Change(ctx, e.Backend, want); err != nil {
		t.Fatal(err)
	}
	if e.Backend.StaleRefusals() != 1 || e.Backend.ApplyCalls() != applies+1 {
		t.Fatalf("stale refusals %d, applies %d; want the Update refused once and one full apply", e.Backend.StaleRefusals(), e.Backend.ApplyCalls()-applies)
	}
	if got := testkit.Format(e.Backend.Ruleset(invaliddrop.ID, rules.IPv4)); got != testkit.Format(want) {
		t.Fatalf("the fake holds\n%s\nwant\n%s", got, testkit.Format(want))
	}
	if ok, err := testkit.InSync(ctx, e.Backend, want); !ok || err != nil {
		t.Fatalf("after the full apply the record does not match: %v, %v", ok, err)
	}
	// Without tampering the same kind of change goes through Update, refused never.
	if err := testkit.Change(ctx, e.Backend, rulesOf(t, nil)); err != nil || e.Backend.StaleRefusals() != 1 {
		t.Fatalf("an Update from a good record: %v, %d stale refusals", err, e.Backend.StaleRefusals())
	}
}

// Interference branch: someone changes our objects right after our commit; the read-back finds it,
// the Driver applies once more and reports a repair. A second interference in a row is an error
// (the record stays dropped) and the next Verify applies again without trusting it.
func TestFakeInterferenceIsAppliedAgain(t *testing.T) {
	ctx := context.Background()
	e := testkit.NewFixEnv(t, invaliddrop.New, nil)
	rs := rulesOf(t, nil)
	e.Backend.InterfereAfterApply(invaliddrop.ID, rules.IPv4, 1)
	res, err := testkit.Verify(ctx, e.Backend, rs)
	if err != nil || !res.Repaired || e.Backend.ApplyCalls() != 2 {
		t.Fatalf("one interference: %+v, %v, %d applies; want repaired with a second apply", res, err, e.Backend.ApplyCalls())
	}
	if ok, err := testkit.InSync(ctx, e.Backend, rs); !ok || err != nil {
		t.Fatalf("after the second apply: in sync %v, %v", ok, err)
	}
	e.Backend.InterfereAfterApply(invaliddrop.ID, rules.IPv4, 2)
	e.Backend.Tamper(invaliddrop.ID, rules.IPv4)
	if _, err := testkit.Verify(ctx, e.Backend, rs); !errors.Is(err, backend.ErrInterfered) {
		t.Fatalf("two interferences in a row: %v; want ErrInterfered", err)
	}
	if res, err := testkit.Verify(ctx, e.Backend, rs); err != nil || !res.Applied {
		t.Fatalf("the Verify after: %+v, %v; want it applied", res, err)
	}
	if ok, err := testkit.InSync(ctx, e.Backend, rs); !ok || err != nil {
		t.Fatalf("after it: in sync %v, %v", ok, err)
	}
}

// Declined-update branch: a change of chains (not of map entries) is one the fake's Update does
// not make, as a kernel backend's Update declines a change it has no cheap way for; the Driver
// applies it in full, and a change of entries after it goes through Update again.
func TestFakeDeclinedUpdateIsAppliedInFull(t *testing.T) {
	ctx := context.Background()
	e := testkit.NewFixEnv(t, invaliddrop.New, nil)
	e.Sync(nil, rules.IPv4)
	applies := e.Backend.ApplyCalls()
	want := rulesOf(t, map[string]any{"protocols": []any{"tcp"}})
	if err := testkit.Change(ctx, e.Backend, want); err != nil {
		t.Fatal(err)
	}
	if e.Backend.DeclinedUpdates() != 1 || e.Backend.ApplyCalls() != applies+1 || e.Backend.StaleRefusals() != 0 {
		t.Fatalf("declined %d, applies %d, stale %d; want the Update declined once and one full apply",
			e.Backend.DeclinedUpdates(), e.Backend.ApplyCalls()-applies, e.Backend.StaleRefusals())
	}
	if got := testkit.Format(e.Backend.Ruleset(invaliddrop.ID, rules.IPv4)); got != testkit.Format(want) {
		t.Fatalf("the fake holds\n%s\nwant\n%s", got, testkit.Format(want))
	}
}

// Rejected objects: the "kernel" refuses one Service's entries; the fix's other Service is
// programmed, the refused one is a skip (backend.ReasonRejected) naming it, in the report the fix
// observes; once accepted it is programmed.
func TestFakeRejectedObjectIsSkipped(t *testing.T) {
	e := testkit.NewFixEnv(t, ipvsexternalipdnat.New, nil)
	snap := testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24"))), testkit.WithServices(
		testkit.Service("default", "web", testkit.ClusterIPs("10.96.0.10"), testkit.LoadBalancer("203.0.113.10"), testkit.Ports(testkit.Named("http", testkit.TCP(80)))),
		testkit.Service("tenant", "bad", testkit.ClusterIPs("10.96.0.11"), testkit.LoadBalancer("203.0.113.11"), testkit.Ports(testkit.Named("http", testkit.TCP(80)))),
	))
	e.Backend.RejectObject("tenant/bad:http")
	_, report := e.Sync(snap, rules.IPv4)
	held := testkit.Format(e.Backend.Ruleset(ipvsexternalipdnat.ID, rules.IPv4))
	if !strings.Contains(held, "default/web:http") || strings.Contains(held, "tenant/bad") {
		t.Fatalf("the fake holds\n%s\nwant default/web's entry and not tenant/bad's", held)
	}
	var skips []fix.Skip
	for _, s := range report.Skipped {
		if s.Reason == backend.ReasonRejected {
			skips = append(skips, s)
		}
	}
	if len(skips) != 1 || skips[0].Object != "tenant/bad:http" || !strings.Contains(skips[0].Detail, "tenant/bad") {
		t.Fatalf("skips %+v; want one %s skip naming tenant/bad:http", report.Skipped, backend.ReasonRejected)
	}
	e.Backend.AcceptObject("tenant/bad:http")
	// The refused entries are unchanged: they stay out until they change or the record is dropped.
	e.Backend.Tamper(ipvsexternalipdnat.ID, rules.IPv4)
	if _, report := e.Sync(snap, rules.IPv4); len(report.Skipped) != 0 {
		t.Fatalf("after the repair: skips %+v", report.Skipped)
	}
	if held := testkit.Format(e.Backend.Ruleset(ipvsexternalipdnat.ID, rules.IPv4)); !strings.Contains(held, "tenant/bad:http") {
		t.Fatalf("the accepted object is not programmed:\n%s", held)
	}
}

// The Driver keeps the entries of the ruleset it reconciled without copying them; a caller that
// modifies them afterwards is caught by the fake's next Update.
func TestFakeModifiedEntriesFail(t *testing.T) {
	ctx := context.Background()
	e := testkit.NewFixEnv(t, ipvsexternalipdnat.New, nil)
	snap := testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24"))), testkit.WithServices(
		testkit.Service("default", "web", testkit.ClusterIPs("10.96.0.10"), testkit.LoadBalancer("203.0.113.10"), testkit.Ports(testkit.TCP(80)))))
	rs, _ := e.Sync(snap, rules.IPv4)
	rs.Maps[0].Entries[0].Port = 81 // modified in place, after the reconcile
	next := rs.Clone()
	next.Maps[0].Entries = append(slices.Clone(rs.Maps[0].Entries), rs.Maps[0].Entries[0])
	next.Maps[0].Entries[1].Port = 82
	if err := testkit.Change(ctx, e.Backend, next); err == nil || !strings.Contains(err.Error(), "modified") {
		t.Fatalf("a change after the caller modified the reconciled entries: %v; want it refused", err)
	}
}
