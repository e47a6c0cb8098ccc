package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// podsFix is an Actuator that reads this node's Pods, like stale-udp-conntrack.
type podsFix struct {
	ensures atomic.Int32
	pods    atomic.Int32 // Pods in the snapshot of the last Ensure
}

func (f *podsFix) ID() string                       { return "reads-pods" }
func (f *podsFix) Description() string              { return "test actuator reading Pods" }
func (f *podsFix) DefaultEnabled(fix.Env) bool      { return false }
func (f *podsFix) Reads() []fix.TableRef            { return []fix.TableRef{inputs.Pods} }
func (f *podsFix) Configure(o map[string]any) error { return nil }
func (f *podsFix) Ensure(_ context.Context, snap *fix.Snapshot, _ bool) (fix.Result, error) {
	f.ensures.Add(1)
	f.pods.Store(int32(len(inputs.Pods.Get(snap))))
	return fix.Result{}, nil
}
func (f *podsFix) Revert(context.Context) error { return nil }

// A fix enabled by a reload gets its watch started, and does nothing until the watch synced; while
// it waits, nnm_fix_enabled is 0 and /readyz and the status say why. Before, the reload only logged
// "restart the agent" and the fix ran on an empty Pod list (issue 19, item 3).
func TestReloadStartsTheWatchesOfAnEnabledFix(t *testing.T) {
	src := newMemSource()
	src.pods.unsynced = errors.New("Pods")
	f := &podsFix{}
	reg := prometheus.NewRegistry()
	m := metrics.NewSync(reg)
	c := config.Defaults()
	c.MinSyncPeriod = 10 * time.Millisecond
	e := mustNew(t, Options{Fixes: []fix.Fix{f}, Hub: src.hub, Inputs: src.ins(), Config: &c, Metrics: m})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	enabled := func() float64 { return testutil.ToFloat64(m.Enabled.WithLabelValues("reads-pods")) }

	on := config.Defaults()
	on.MinSyncPeriod = c.MinSyncPeriod
	on.Fixes = map[string]map[string]any{"reads-pods": {"enabled": true}}
	e.Reconfigure(&on)
	agenttest.Until(t, wait, func() bool { return src.pods.startCount() > 0 })
	// The worker marks the unit waiting before it waits for the watch, and runs nothing until the
	// watch synced: once the status says waiting, the fix has had its chance to run too early.
	agenttest.Until(t, wait, func() bool {
		st := e.Statuses()
		return len(st) == 1 && len(st[0].Units) == 1 && st[0].Units[0].Waiting
	})
	if n := f.ensures.Load(); n != 0 {
		t.Fatalf("the fix ran %d times before its Pods watch synced", n)
	}
	if v := enabled(); v != 0 {
		t.Errorf("nnm_fix_enabled = %v while the fix waits for its watch, want 0", v)
	}
	// Ready says why once the worker's waiting pass is accounted (a CI run read it a moment before:
	// "no successful sync yet" without the reason).
	agenttest.Eventually(t, wait, func() error {
		if err := e.Ready(); err == nil || !strings.Contains(err.Error(), "waiting for the watches it reads") {
			return fmt.Errorf("Ready = %v; want the fix waiting for its watches", err)
		}
		return nil
	})
	src.pods.setSynced(nil)
	// Ready clears when the first pass has been accounted, just after the fix's Ensure ran: wait
	// for both rather than read Ready the moment Ensure has been counted (a race under load).
	agenttest.Eventually(t, wait, func() error {
		if f.ensures.Load() == 0 || enabled() != 1 {
			return fmt.Errorf("the fix has not run (ensures %d, nnm_fix_enabled %v)", f.ensures.Load(), enabled())
		}
		if err := e.Ready(); err != nil {
			return fmt.Errorf("Ready = %w after the watch synced", err)
		}
		return nil
	})
}

// A reload that enables a fix whose watch cannot be started is rejected, naming the fix and the
// watch; the running set stays (the fix stays disabled) and the rejection is counted.
func TestReloadRejectedWhenWatchesCannotStart(t *testing.T) {
	src := newMemSource()
	src.pods.startErr = errors.New("no API client")
	f := &podsFix{}
	m := metrics.NewSync(prometheus.NewRegistry())
	c := config.Defaults()
	rejected := &rejections{}
	e := mustNew(t, Options{Fixes: []fix.Fix{f}, Hub: src.hub, Inputs: src.ins(), Config: &c, Metrics: m, Notify: rejected})
	on := config.Defaults()
	on.Fixes = map[string]map[string]any{"reads-pods": {"enabled": true}}
	if e.applyConfig(context.Background(), &on) {
		t.Fatal("a reload whose watches cannot start was taken")
	}
	if st := e.Statuses(); st[0].Enabled {
		t.Error("the fix is enabled after the rejected reload")
	}
	if len(rejected.errs) != 1 || !strings.Contains(rejected.errs[0].Error(), "fix reads-pods (Pods)") ||
		!strings.Contains(rejected.errs[0].Error(), "no API client") {
		t.Errorf("ConfigRejected got %v; want one error naming the fix, its watch and the cause", rejected.errs)
	}
	if v := testutil.ToFloat64(m.Enabled.WithLabelValues("reads-pods")); v != 0 {
		t.Errorf("nnm_fix_enabled = %v, want 0", v)
	}
	if v := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("error")); v != 1 {
		t.Errorf("config_reloads_total{result=error} = %v, want 1", v)
	}
	if e.SyncOnce(context.Background(), true) || f.ensures.Load() != 0 {
		t.Error("the fix of the rejected reload ran")
	}
}

type rejections struct {
	nopNotifier
	errs []error
}

func (r *rejections) ConfigRejected(err error) { r.errs = append(r.errs, err) }

// moreFix is an Actuator whose passes stop at a bound with work left (fix.Result.More) a few times.
type moreFix struct {
	podsFix
	left atomic.Int32
}

func (f *moreFix) ID() string            { return "bounded" }
func (f *moreFix) Reads() []fix.TableRef { return nil }
func (f *moreFix) Ensure(ctx context.Context, snap *fix.Snapshot, full bool) (fix.Result, error) {
	f.ensures.Add(1)
	return fix.Result{More: f.left.Add(-1) > 0}, nil
}

// A pass that stops at its bound with work left is followed by the next one after minSyncPeriod,
// not after the next syncPeriod (issue 19, item 5: the next batch waited a whole syncPeriod). The
// engine runs on a fake clock that the test steps.
func TestMoreRunsTheNextPassSoon(t *testing.T) {
	f := &moreFix{}
	f.left.Store(4)
	c := config.Defaults()
	c.MinSyncPeriod = 10 * time.Millisecond
	c.SyncPeriod = time.Hour
	c.Fixes = map[string]map[string]any{"bounded": {"enabled": true}}
	fc := clocktesting.NewFakeClock(time.Now())
	e := mustNew(t, Options{Fixes: []fix.Fix{f}, Config: &c, Clock: fc})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	// The clock moves minSyncPeriod per poll: far less than syncPeriod within the wait.
	agenttest.Until(t, wait, func() bool { fc.Step(c.MinSyncPeriod); return f.ensures.Load() >= 4 })
	// A heartbeat opens each turn of the worker's loop, and a pending pass (work left over) runs in
	// that turn, before the next beat. Once two beats on the clock are in (the first may open the
	// turn right after the fourth pass), a fifth pass would have run.
	for range 2 {
		fc.Step(heartbeatEvery)
		at := fc.Now()
		agenttest.Until(t, wait, func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return !e.units[0].beat.Before(at)
		})
	}
	if n := f.ensures.Load(); n != 4 {
		t.Errorf("%d passes; want 4 (three with work left, then the one that finished), none after", n)
	}
}
