package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// recNotifier records what the engine tells its Notifier as "Reason fix" lines.
type recNotifier struct {
	mu  sync.Mutex
	got []string
}

func (r *recNotifier) add(reason, fix string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, reason+" "+fix)
}
func (r *recNotifier) FixEnabled(f string)                   { r.add("FixEnabled", f) }
func (r *recNotifier) FixDisabled(f string)                  { r.add("FixDisabled", f) }
func (r *recNotifier) FixRefused(f string, _ error)          { r.add("FixRefused", f) }
func (r *recNotifier) FixSynced(f string)                    { r.add("FixSynced", f) }
func (r *recNotifier) FixSyncFailed(f string, _ error)       { r.add("FixSyncFailed", f) }
func (r *recNotifier) ObjectSkipped(f, _ string, _ fix.Skip) { r.add("ObjectSkipped", f) }
func (r *recNotifier) ConfigRejected(err error)              { r.add("ConfigRejected", err.Error()) }
func (r *recNotifier) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

func (r *recNotifier) count(line string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.got {
		if l == line {
			n++
		}
	}
	return n
}

// The engine tells its Notifier: at start which fixes run or are refused (not the ones off by
// default); a fix's first successful sync once (both families synced), not every sync; each failed
// sync; on a reload what changed, nothing when nothing changed, and a rejected config.
func TestNotifierHearsLifecycle(t *testing.T) {
	on := &countFix{id: "on", defaultOn: true}
	off := &countFix{id: "off"}
	picky := &countFix{id: "picky", refuse: errors.New("not in this proxy mode")}
	c := config.Defaults()
	c.MinSyncPeriod = 10 * time.Millisecond
	c.Fixes = map[string]map[string]any{"picky": {"enabled": true}}
	h := newHarness(t, &c, on, off, picky)
	rec := &recNotifier{}
	h.e.notify = rec
	h.e.now = time.Now
	h.src.set(svc("a", "10.96.0.1"))
	if err := h.e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, wait, func() bool { return rec.count("FixSynced on") == 1 })
	applies := h.be.ApplyCalls()
	h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	agenttest.Until(t, wait, func() bool { return h.be.ApplyCalls() > applies })
	if err := h.e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := rec.take()
	slices.Sort(got)
	if want := []string{"FixEnabled on", "FixRefused picky", "FixSynced on"}; !slices.Equal(got, want) {
		t.Fatalf("at start: got %q, want %q", got, want)
	}

	ctx := context.Background()
	h.be.SetApplyError(errors.New("kernel says no"))
	h.src.set(svc("a", "10.96.0.3"))
	h.e.SyncOnce(ctx, false)
	h.e.SyncOnce(ctx, false)
	if h.be.FailedApplies() < 2 {
		t.Fatalf("want two failed applies, got %d", h.be.FailedApplies())
	}
	if got, want := rec.take(), slices.Repeat([]string{"FixSyncFailed on"}, h.be.FailedApplies()); !slices.Equal(got, want) {
		t.Fatalf("one per failed apply: got %q, want %q", got, want)
	}
	h.be.SetApplyError(nil)
	h.e.SyncOnce(ctx, true)
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("a success after failures is not a first sync: got %q", got)
	}

	swap := config.Defaults()
	swap.Fixes = map[string]map[string]any{"on": {"enabled": false}, "off": {"enabled": true}, "picky": {"enabled": true}}
	for i := range 2 {
		if !h.e.applyConfig(ctx, &swap) {
			t.Fatal("config rejected")
		}
		got := rec.take()
		slices.Sort(got)
		var want []string
		if i == 0 {
			want = []string{"FixDisabled on", "FixEnabled off"}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("reload %d: got %q, want %q (the refusal is told once)", i, got, want)
		}
	}
	off.optErr = errors.New("bad option")
	if h.e.applyConfig(ctx, &c) {
		t.Fatal("config with a rejected option was taken")
	}
	if got := rec.take(); len(got) != 1 || got[0] != fmt.Sprintf("ConfigRejected %v", "config: fixes.off: bad option") {
		t.Fatalf("rejected reload: got %q", got)
	}
	off.optErr = nil
	if !h.e.applyConfig(ctx, &c) {
		t.Fatal("config rejected")
	}
	h.e.SyncOnce(ctx, true)
	got = rec.take()
	slices.Sort(got)
	if want := []string{"FixDisabled off", "FixEnabled on", "FixSynced on"}; !slices.Equal(got, want) {
		t.Fatalf("re-enabled: got %q, want %q (a new first sync)", got, want)
	}
}

// An object whose rules the kernel refuses (the fake's RejectObject) is a skip like a fix's own:
// nnm_fix_objects_skipped{reason="rejected-by-kernel"} and one ObjectSkipped naming it, not one per
// pass; the fix's other objects are programmed.
func TestRejectedObjectIsSkipped(t *testing.T) {
	f := &countFix{id: "count", defaultOn: true, entries: true}
	h := newHarness(t, nil, f)
	rec := &skipNotifier{}
	h.e.notify = rec
	h.be.RejectObject("default/b")
	h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	ctx := context.Background()
	for range 3 {
		if h.e.SyncOnce(ctx, true) {
			t.Fatal("a pass failed")
		}
	}
	if got := rec.skips; len(got) != 1 || got[0].Object != "default/b" || got[0].Reason != fix.ReasonRejected {
		t.Fatalf("ObjectSkipped %+v; want one for default/b", got)
	}
	if v := testutil.ToFloat64(h.m.Skipped.WithLabelValues("count", "ipv4", fix.ReasonRejected)); v != 1 {
		t.Fatalf("nnm_fix_objects_skipped = %v, want 1", v)
	}
	held := testkit.Format(h.be.Ruleset("count", rules.IPv4))
	if !strings.Contains(held, "default/a") || strings.Contains(held, "default/b") {
		t.Fatalf("the backend holds\n%s\nwant default/a's entry only", held)
	}
	// The object changes and is taken: programmed, the skip gone.
	h.be.AcceptObject("default/b")
	h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.3"))
	h.e.SyncOnce(ctx, false)
	if v := testutil.ToFloat64(h.m.Skipped.WithLabelValues("count", "ipv4", fix.ReasonRejected)); v != 0 {
		t.Fatalf("after the object changed: nnm_fix_objects_skipped = %v, want 0", v)
	}
}

// skipNotifier records the skips it hears.
type skipNotifier struct {
	nopNotifier
	skips []fix.Skip
}

func (r *skipNotifier) ObjectSkipped(_, _ string, s fix.Skip) { r.skips = append(r.skips, s) }
