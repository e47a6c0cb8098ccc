package engine

import (
	"context"
	"errors"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// heartbeatEvery is how often an idle worker says it is alive (see Alive).
var heartbeatEvery = time.Second

// needsSyncer is implemented by sources that can wait for the watches of some needs only, so that
// a fix reading the Node does not wait for the Services list.
type needsSyncer interface {
	WaitForNeeds(ctx context.Context, needs fix.Needs) error
}

// dispatch hands every change of the watches to every worker and takes new configurations.
func (e *Engine) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.source.Changes():
			for _, u := range e.units {
				signal(u.kick)
			}
		case cfg := <-e.reconfig:
			e.applyConfig(cfg)
		}
	}
}

// work is the worker of one unit: it waits for what the unit's fix reads, then syncs on changes
// (at most once per minSyncPeriod), verifies the kernel every syncPeriod and after a config change,
// and retries failures with backoff. A change that arrives during a verify preempts it.
func (e *Engine) work(ctx context.Context, u *unit) {
	beat := time.NewTicker(heartbeatEvery)
	defer beat.Stop()
	if !e.waitNeeds(ctx, u, beat.C) {
		return
	}
	var last time.Time
	pending, full := true, true
	var backoff time.Duration
	var retry <-chan time.Time
	resync := time.NewTicker(e.syncPeriod())
	defer resync.Stop()
	for {
		e.heartbeat(u)
		if pending {
			if wait := e.minSyncPeriod() - e.now().Sub(last); wait > 0 && !last.IsZero() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			kicked := drain(u.kick)
			var err error
			again := false
			switch {
			case full && kicked:
				// A change is waiting: it goes first, trusting the record; the verify follows.
				err = e.pass(ctx, u, false)
				again = ctx.Err() == nil
			case full:
				err, again = e.verify(ctx, u)
			default:
				err = e.pass(ctx, u, false)
			}
			if ctx.Err() != nil {
				return
			}
			last = e.now()
			pending, full = again, again
			retry = nil
			if err != nil {
				backoff = nextBackoff(backoff, e.minSyncPeriod(), e.syncPeriod())
				e.log.Info("sync failed; retrying", "unit", u.String(), "in", backoff)
				retry = time.After(backoff)
			} else {
				backoff = 0
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-u.kick:
			pending = true
		case <-resync.C:
			pending, full = true, true
		case <-retry:
			pending, full = true, true
		case <-u.reconf:
			resync.Reset(e.syncPeriod())
			pending, full = true, true
		case <-beat.C:
		}
	}
}

// verify runs a full pass of u that a change preempts: the change is then applied at once
// (trusting the backend's record) and again reports that the verify must run once more.
func (e *Engine) verify(ctx context.Context, u *unit) (err error, again bool) {
	passCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	preempted := false
	done, watcher := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-u.kick:
			preempted = true
			cancel()
		case <-done:
		}
	}()
	err = e.pass(passCtx, u, true)
	close(done)
	<-watcher
	if !preempted {
		return err, false
	}
	e.log.Debug("a change preempted the verify pass", "unit", u.String())
	cerr := e.pass(ctx, u, false)
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return cerr, true
	}
	return errors.Join(err, cerr), false
}

// waitNeeds waits until the watches the unit's fix reads have synced, beating meanwhile. A unit
// that is not wanted, or whose fix reads nothing, does not wait. It returns false when ctx ended.
func (e *Engine) waitNeeds(ctx context.Context, u *unit, beat <-chan time.Time) bool {
	for {
		e.heartbeat(u)
		e.mu.Lock()
		wanted, watchErr := e.wantedLocked(u), e.watchErr
		e.mu.Unlock()
		needs := needsOf(u.st.fix)
		if !wanted || needs == (fix.Needs{}) {
			return true
		}
		if watchErr != nil {
			e.mu.Lock()
			u.lastErr = watchErr
			e.mu.Unlock()
		} else {
			wctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
			var err error
			if ns, ok := e.source.(needsSyncer); ok {
				err = ns.WaitForNeeds(wctx, needs)
			} else {
				err = e.source.WaitForSync(wctx)
			}
			cancel()
			if err == nil {
				return true
			}
			e.mu.Lock()
			u.lastErr = ErrWaitingForWatches
			e.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return false
		case <-u.reconf:
		case <-beat:
		}
	}
}

func (e *Engine) heartbeat(u *unit) {
	e.mu.Lock()
	u.beat = e.now()
	e.mu.Unlock()
}

// drain empties c and reports whether anything was in it.
func drain(c <-chan struct{}) (any bool) {
	for {
		select {
		case <-c:
			any = true
		default:
			return any
		}
	}
}

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
