package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// heartbeatEvery is how often an idle worker says it is alive (see Alive).
var heartbeatEvery = time.Second

// needsSynced returns nil when the inputs u's fix reads hold their first state (or it reads none),
// else why not. A unit must not act before: a fix would judge an empty list of Pods or no Node as
// the truth.
func (e *Engine) needsSynced(u *unit) error {
	if len(u.st.reads) == 0 {
		return nil
	}
	e.mu.Lock()
	watchErr := e.watchErr
	e.mu.Unlock()
	if watchErr != nil {
		return watchErr
	}
	return inputsSynced(u.st.reads)
}

// dispatch hands the changes of the inputs to the workers of the units that read them, and takes
// new configurations.
func (e *Engine) dispatch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.hub.Changes():
			e.wake()
		case cfg := <-e.reconfig:
			e.applyConfig(ctx, cfg)
		}
	}
}

// work is the worker of one unit: it waits for what the unit's fix reads, then syncs on changes
// (at most once per minSyncPeriod), verifies the kernel every syncPeriod and after a config change,
// and retries failures with backoff. A change that arrives during a verify preempts it.
func (e *Engine) work(ctx context.Context, u *unit) {
	beat := e.clock.NewTicker(heartbeatEvery)
	defer beat.Stop()
	if !e.waitNeeds(ctx, u, beat.C()) {
		return
	}
	pace := pacing{clock: e.clock}
	pending, full := true, true
	var retry <-chan time.Time
	resync := e.clock.NewTicker(e.syncPeriod())
	defer func() { resync.Stop() }()
	for {
		e.heartbeat(u)
		if pending {
			if !pace.wait(ctx, e.minSyncPeriod()) {
				return
			}
			// A reload may have enabled the fix: wait for its watches, doing nothing meanwhile.
			if !e.waitNeeds(ctx, u, beat.C()) {
				return
			}
			kicked := drain(u.kick)
			var err error
			again := false
			e.setBusy(u, true)
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
			e.setBusy(u, false)
			if ctx.Err() != nil {
				return
			}
			if errors.As(err, new(errWaiting)) {
				continue // the fix was enabled between the wait and the pass: wait again
			}
			pending, full = again, again
			e.mu.Lock()
			if u.more && err == nil {
				// The Actuator left work over: the next pass follows after minSyncPeriod.
				u.more, pending = false, true
			}
			e.mu.Unlock()
			var backoff time.Duration
			if retry, backoff = pace.done(err, e.minSyncPeriod(), e.syncPeriod()); err != nil {
				e.log.Info("sync failed; retrying", "unit", u.String(), "in", backoff)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-u.kick:
			pending = true
		case <-resync.C():
			pending, full = true, true
		case <-retry:
			pending, full = true, true
		case <-u.reconf:
			resync.Stop()
			resync = e.clock.NewTicker(e.syncPeriod())
			pending, full = true, true
		case <-beat.C():
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
// that is not wanted, or whose fix reads nothing, does not wait. While it waits the unit is marked
// waiting (its fix is not counted as running) with the reason as its last error, which /readyz and,
// after 2 × syncPeriod, /healthz report. It returns false when ctx ended.
func (e *Engine) waitNeeds(ctx context.Context, u *unit, beat <-chan time.Time) bool {
	for {
		e.heartbeat(u)
		e.mu.Lock()
		wanted := e.wantedLocked(u)
		e.mu.Unlock()
		err := e.needsSynced(u)
		e.mu.Lock()
		if u.waiting != (wanted && err != nil) {
			u.waiting = wanted && err != nil
			e.setEnabledLocked(u.st)
		}
		if wanted && err != nil {
			u.lastErr = fmt.Errorf("%w: %w", ErrWaitingForWatches, err)
		}
		e.mu.Unlock()
		if !wanted || err == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-u.reconf:
		case <-u.kick:
		case <-beat:
		case <-e.clock.After(waitPoll):
		}
	}
}

// waitPoll is how often a waiting unit looks at its watches again (a first list with no objects
// sends no change).
const waitPoll = 50 * time.Millisecond

// setBusy marks the start (or the end) of one of u's passes, and beats.
func (e *Engine) setBusy(u *unit, in bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	u.beat = e.now()
	u.busy = time.Time{}
	if in {
		u.busy = u.beat
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
