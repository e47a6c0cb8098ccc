package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// clock is a settable time source that running workers may read.
type fakeNow struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeNow) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// running is an engine whose workers run (Start), on a settable clock, for one IPv4 family.
type running struct {
	e   *Engine
	be  *testkit.FakeBackend
	clk *fakeNow
}

// launch starts an engine on be and src, with fixes, for IPv4 only and a short minSyncPeriod.
func launch(t *testing.T, be *testkit.FakeBackend, src *memSource, fixes ...fix.Fix) *running {
	t.Helper()
	c := config.Defaults()
	c.Families = []string{"ipv4"}
	c.MinSyncPeriod = 10 * time.Millisecond
	r := &running{be: be, clk: &fakeNow{now: time.Unix(1000, 0)}}
	e := mustNew(t, Options{Fixes: fixes, Backend: be, Hub: src.hub, Inputs: src.ins(), Config: &c, Now: r.clk.Now})
	r.e = e
	t.Cleanup(func() {
		be.OnReconcile(nil)
		if err := e.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *running) rules(fix string) int {
	rs := r.be.Ruleset(fix, rules.IPv4)
	if rs == nil {
		return -1
	}
	return len(rs.Chains[0].Rules)
}

// A change of Services lands while a Verify pass (the periodic resync) is stuck reading the
// kernel: the change preempts it instead of queueing behind it.
func TestChangePreemptsVerify(t *testing.T) {
	src := newMemSource()
	src.set(svc("a", "10.96.0.1"))
	r := launch(t, testkit.NewFakeBackend(), src, &countFix{id: "count", defaultOn: true})
	agenttest.Until(t, wait, func() bool { return r.rules("count") == 1 })
	var verifying atomic.Int32
	r.be.OnReconcile(func(ctx context.Context, _ string, _ rules.Family, mode backend.Mode) error {
		if mode != backend.Verify {
			return nil
		}
		verifying.Add(1)
		<-ctx.Done() // a read-back that takes as long as it is allowed to
		return ctx.Err()
	})
	c := config.Defaults()
	c.Families = []string{"ipv4"}
	c.MinSyncPeriod = 10 * time.Millisecond
	r.e.Reconfigure(&c) // a full pass, as the periodic resync would start
	agenttest.Until(t, wait, func() bool { return verifying.Load() == 1 })
	src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	agenttest.Until(t, wait, func() bool { return r.rules("count") == 2 })
	// The verify runs again after the change, and is preempted again by the next one.
	agenttest.Until(t, wait, func() bool { return verifying.Load() == 2 })
	src.set(svc("a", "10.96.0.1"))
	agenttest.Until(t, wait, func() bool { return r.rules("count") == 1 })
	if err := r.e.Healthy(); err != nil {
		t.Fatalf("preempted verifies must not count as failures: %v", err)
	}
}

// One fix whose kernel calls hang (the xtables lock held by another process) neither keeps
// another fix from being programmed nor makes it unhealthy; only its own health and liveness fail.
func TestBlockedFixDoesNotStarveOthers(t *testing.T) {
	src := newMemSource()
	src.set(svc("a", "10.96.0.1"))
	release := make(chan struct{})
	blocked := &countFix{id: "a-blocked", defaultOn: true} // sorts first: today's pass reaches it first
	free := &countFix{id: "b-free", defaultOn: true}
	be := testkit.NewFakeBackend()
	be.OnReconcile(func(ctx context.Context, fix string, _ rules.Family, _ backend.Mode) error {
		if fix != "a-blocked" {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	r := launch(t, be, src, blocked, free)
	t.Cleanup(func() { close(release) })
	agenttest.Until(t, wait, func() bool { return r.rules("b-free") == 1 })
	src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	agenttest.Until(t, wait, func() bool { return r.rules("b-free") == 2 })

	// Two sync periods later, after one more change: only the blocked fix is unhealthy; its worker,
	// inside one pass, is not stuck yet (a pass that waits for the kernel may be long under load).
	r.clk.Add(61 * time.Second)
	before := r.lastOK("b-free")
	src.set(svc("a", "10.96.0.1"))
	agenttest.Until(t, wait, func() bool { return r.lastOK("b-free").After(before) })
	err := r.e.Healthy()
	if err == nil || !strings.Contains(err.Error(), "a-blocked") || strings.Contains(err.Error(), "b-free") {
		t.Fatalf("Healthy = %v; want only a-blocked unhealthy", err)
	}
	if err := r.e.Alive(); err != nil {
		t.Fatalf("Alive = %v after 61 s in one pass; want alive until PassLimitMin", err)
	}
	// Past the pass limit: only the wedged worker of a-blocked is stuck.
	r.clk.Add(PassLimitMin)
	before = r.lastOK("b-free")
	src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	agenttest.Until(t, wait, func() bool { return r.lastOK("b-free").After(before) })
	// The idle worker of b-free beats on the new clock within heartbeatEvery.
	agenttest.Until(t, wait, func() bool { err = r.e.Alive(); return err != nil && !strings.Contains(err.Error(), "b-free") })
	if err == nil || !strings.Contains(err.Error(), "a-blocked") || !strings.Contains(err.Error(), "in one pass") || strings.Contains(err.Error(), "b-free") {
		t.Fatalf("Alive = %v; want only the wedged worker of a-blocked reported", err)
	}
	if r.e.Ready() == nil {
		t.Fatal("ready although a-blocked was never programmed")
	}
}

func (r *running) lastOK(fix string) time.Time {
	for _, st := range r.e.Statuses() {
		if st.Fix == fix {
			return st.LastOK
		}
	}
	return time.Time{}
}

// A backend that fails every apply leaves the workers alive (liveness is a heartbeat of the loop,
// not a sync result) while health fails.
func TestFailingBackendKeepsLiveness(t *testing.T) {
	src := newMemSource()
	be := testkit.NewFakeBackend()
	be.SetApplyError(errors.New("kernel says no"))
	r := launch(t, be, src, &countFix{id: "count", defaultOn: true})
	agenttest.Until(t, wait, func() bool { return be.FailedApplies() >= 2 })
	r.clk.Add(5 * time.Minute)
	// The idle worker beats on the new clock within heartbeatEvery.
	agenttest.Until(t, wait, func() bool { return r.e.Alive() == nil })
	if err := r.e.Alive(); err != nil {
		t.Fatalf("Alive = %v with a failing backend; want alive", err)
	}
	if err := r.e.Healthy(); err == nil || !strings.Contains(err.Error(), "kernel says no") {
		t.Fatalf("Healthy = %v; want the apply error", err)
	}
	// The unit is named once, by the engine: "fix count (ipv4): no successful sync for …; last
	// error: kernel says no", not "… fix count (ipv4): fix count (ipv4): kernel says no".
	for _, err := range []error{r.e.Healthy(), r.e.Ready()} {
		for _, line := range strings.Split(err.Error(), "\n") {
			if n := strings.Count(line, "fix count"); n != 1 {
				t.Errorf("%q names the unit %d times; want once", line, n)
			}
		}
	}
	for _, st := range r.e.Statuses() {
		if st.Fix == "count" && (st.LastErr == nil || strings.Count(st.LastErr.Error(), "fix count (ipv4)") != 1) {
			t.Errorf("status of count: last error %v; want the unit named once", st.LastErr)
		}
	}
}

// needsNothing is a countFix that reads no watch (like invalid-drop).
type needsNothing struct{ countFix }

func (*needsNothing) Reads() []fix.TableRef { return nil }

// A fix that reads nothing from the API is programmed although the watches never sync; the fix
// that reads Services waits, and says why.
func TestFixWithoutNeedsDoesNotWaitForTheAPI(t *testing.T) {
	src := newMemSource()
	src.services.unsynced = errors.New("Services") // no API server reachable: never synced
	local := &needsNothing{countFix{id: "local", defaultOn: true}}
	api := &countFix{id: "reads-services", defaultOn: true}
	r2 := launch(t, testkit.NewFakeBackend(), src, local, api)
	agenttest.Until(t, wait, func() bool { return r2.rules("local") == 0 })
	if r2.rules("reads-services") != -1 {
		t.Fatal("a fix that reads Services was programmed before the watches synced")
	}
	err := r2.e.Ready()
	if err == nil || !strings.Contains(err.Error(), "reads-services") || strings.Contains(err.Error(), "local") {
		t.Fatalf("Ready = %v; want only reads-services pending", err)
	}
	agenttest.Until(t, wait, func() bool {
		for _, st := range r2.e.Statuses() {
			if st.Fix == "reads-services" && st.LastErr != nil && strings.Contains(st.LastErr.Error(), "waiting for the watches") {
				return true
			}
		}
		return false
	})
}
