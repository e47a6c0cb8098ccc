package engine

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// pacing is the rate-limit and backoff policy of one unit's worker, on the engine's clock (tests
// step a fake one instead of sleeping): at most one pass per minSyncPeriod after the last one
// ended, and a failed pass retried after a backoff that doubles from minSyncPeriod up to
// syncPeriod and starts again after a success. A change preempting a verify is the worker's
// (Engine.verify); pacing only says when the next pass may run.
type pacing struct {
	clock   clock.Clock
	last    time.Time     // when the last pass ended (zero: none yet)
	backoff time.Duration // the wait before the next retry (0: the last pass succeeded)
}

// wait blocks until min has passed since the last pass ended; false when ctx ended first.
func (p *pacing) wait(ctx context.Context, min time.Duration) bool {
	if p.last.IsZero() {
		return true
	}
	d := min - p.clock.Since(p.last)
	if d <= 0 {
		return true
	}
	select {
	case <-ctx.Done():
		return false
	case <-p.clock.After(d):
		return true
	}
}

// done records the end of a pass that returned err, and returns when to retry it (nil: no retry)
// and after how long.
func (p *pacing) done(err error, min, max time.Duration) (<-chan time.Time, time.Duration) {
	p.last = p.clock.Now()
	if err == nil {
		p.backoff = 0
		return nil, 0
	}
	p.backoff = nextBackoff(p.backoff, min, max)
	return p.clock.After(p.backoff), p.backoff
}

// nextBackoff doubles cur within [lo, hi] (lo 0: 100 ms).
func nextBackoff(cur, lo, hi time.Duration) time.Duration {
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if cur < lo {
		return lo
	}
	if cur*2 > hi {
		return hi
	}
	return cur * 2
}
