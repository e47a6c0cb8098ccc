package testkit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
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
