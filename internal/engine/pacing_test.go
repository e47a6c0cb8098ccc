package engine

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestPacing steps a fake clock through the policy: the first pass runs at once, the next waits
// out minSyncPeriod after the last ended, failures back off doubling from minSyncPeriod to
// syncPeriod, and a success resets the backoff. Nothing sleeps: a waiter on the fake clock shows
// the pass is held.
func TestPacing(t *testing.T) {
	const lo, hi = time.Second, 5 * time.Second
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := pacing{clock: fc}
	ctx := context.Background()
	if !p.wait(ctx, lo) {
		t.Fatal("the first pass waited")
	}
	if retry, _ := p.done(nil, lo, hi); retry != nil {
		t.Fatal("a success asks for a retry")
	}
	released := make(chan bool)
	go func() { released <- p.wait(ctx, lo) }()
	for !fc.HasWaiters() {
		runtime.Gosched() // until the goroutine reaches its wait
	}
	fc.Step(lo - time.Millisecond)
	select {
	case <-released:
		t.Fatal("a pass ran before minSyncPeriod had passed")
	default:
	}
	fc.Step(time.Millisecond)
	if !<-released {
		t.Fatal("wait reported a cancelled context")
	}

	var got []time.Duration
	for range 4 {
		retry, d := p.done(errors.New("no"), lo, hi)
		got = append(got, d)
		fc.Step(d - time.Millisecond)
		select {
		case <-retry:
			t.Fatalf("retry %d fired before its backoff of %v", len(got), d)
		default:
		}
		fc.Step(time.Millisecond)
		<-retry
	}
	if want := []time.Duration{lo, 2 * lo, 4 * lo, hi}; !slices.Equal(got, want) {
		t.Fatalf("backoffs %v, want %v", got, want)
	}
	if _, d := p.done(nil, lo, hi); d != 0 || p.backoff != 0 {
		t.Fatalf("a success left the backoff at %v", p.backoff)
	}
	if _, d := p.done(errors.New("again"), lo, hi); d != lo {
		t.Fatalf("the first failure after a success backs off %v, want %v", d, lo)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if p.wait(cctx, lo) {
		t.Fatal("wait ignored its cancelled context")
	}
}
