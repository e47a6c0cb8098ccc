package engine

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// revisions numbers the computed rulesets (rules.Ruleset.Revision) of every engine in the process.
var revisions atomic.Uint64

// syncOnceWait bounds how long SyncOnce waits for the inputs it started to list.
const syncOnceWait = 10 * time.Second

// SyncOnce runs one pass of every unit in turn, in the caller's goroutine (tests), after starting
// the inputs the enabled fixes read and waiting (at most syncOnceWait) for those it started. A full pass verifies the kernel and
// retries pending removals. It reports whether any unit failed.
func (e *Engine) SyncOnce(ctx context.Context, full bool) (failed bool) {
	e.mu.Lock()
	ins := e.readLocked()
	e.mu.Unlock()
	started, err := e.startInputs(ins)
	if err != nil {
		e.log.Error("cannot start the watches; fixes that read them wait", "err", err)
	}
	if len(started) > 0 {
		// Inputs started here (a file's objects, a test's API) get a bounded wait for their
		// first list; a unit whose inputs have not synced after it waits, as always.
		wctx, cancel := context.WithTimeout(ctx, syncOnceWait)
		_ = e.waitSynced(wctx, started)
		cancel()
	}
	for _, u := range e.units {
		e.mu.Lock()
		run := e.wantedLocked(u) || (full && !u.reverted)
		e.mu.Unlock()
		if run && e.pass(ctx, u, full) != nil {
			failed = true
		}
	}
	return failed
}

// pass runs one pass of u: a sync when the unit is wanted, its removal otherwise. When ctx ends
// during the pass it returns ctx's error and records nothing (a preempted Verify is not a failure).
func (e *Engine) pass(ctx context.Context, u *unit, full bool) error {
	u.run.Lock()
	defer u.run.Unlock()
	e.mu.Lock()
	wanted, reverted := e.wantedLocked(u), u.reverted
	e.mu.Unlock()
	if !wanted {
		if reverted {
			return nil
		}
		return e.remove(ctx, u)
	}
	if err := e.needsSynced(u); err != nil {
		// Never act on watches that have not synced (a reload may just have enabled the fix).
		return errWaiting{err}
	}
	if u.st.act != nil {
		return e.ensure(ctx, u, u.st.act, full)
	}
	return e.sync(ctx, u, full)
}

// errWaiting is a pass that did nothing because the unit's watches have not synced.
type errWaiting struct{ err error }

func (e errWaiting) Error() string {
	return "waiting for the watches it reads to sync: " + e.err.Error()
}
func (e errWaiting) Unwrap() error { return e.err }

// Is makes a refused pass read as waiting for watches, so probes give it the short form.
func (e errWaiting) Is(target error) bool { return target == ErrWaitingForWatches }

// sync computes the unit's rules and reconciles the backend with them.
func (e *Engine) sync(ctx context.Context, u *unit, full bool) (err error) {
	id, fam, bname := u.st.fix.ID(), u.family, e.be.Name()
	start := e.now()
	defer func() { err = e.account(ctx, u, bname, start, err) }()
	rs, report, err := e.computeRules(u)
	if err != nil {
		return fmt.Errorf("compute rules: %w", err)
	}
	mode := backend.Trust
	if full {
		mode = backend.Verify
	}
	res, err := e.be.Reconcile(ctx, id, fam, rs, mode)
	if err != nil {
		e.report(u, report)
		return err
	}
	report = report.WithRejected(res.Rejected)
	e.report(u, report)
	if res.Repaired {
		e.log.Warn("rules changed behind our back; restored them", "fix", id, "family", fam)
		e.m.Repairs.WithLabelValues(id, bname, string(fam)).Inc()
	}
	n := 0
	if rs != nil {
		n = rs.RuleCount()
	}
	if res.Applied {
		e.log.Info("rules applied", "fix", id, "family", fam, "rules", n)
	}
	e.m.Rules.WithLabelValues(id, bname, string(fam)).Set(float64(n))
	if o, ok := u.st.fix.(fix.Observer); ok {
		o.Observe(ctx, fam, report)
	}
	return nil
}

// computeRules returns the unit's ruleset for what its fix's inputs hold now. Rules is pure, so when
// neither those inputs' revisions nor the configuration changed since the unit's last successful
// computation, that result is returned as it was (with its Revision: the backend knows it without
// comparing): a periodic Verify of an idle node costs no computation over every Service (nor the
// garbage it would leave). Every new computation gets a new Revision. Call with u.run held.
func (e *Engine) computeRules(u *unit) (*rules.Ruleset, fix.Report, error) {
	version := revision(u.st.reads) // read before the snapshot: the snapshot is at least this new
	e.mu.Lock()
	cfgGen := e.cfgGen
	e.mu.Unlock()
	if c := &u.computed; c.valid && c.version == version && c.cfgGen == cfgGen {
		return c.rs, c.report, nil
	}
	u.computed = computed{}
	rs, report, err := u.st.rules.Rules(e.snapshot(u.st.reads), u.family)
	if err != nil {
		return nil, fix.Report{}, err
	}
	if rs != nil {
		rs.Revision = revisions.Add(1)
	}
	u.computed = computed{valid: true, version: version, cfgGen: cfgGen, rs: rs, report: report}
	return rs, report, nil
}

// ensure runs one Ensure of an Actuator, with the same metrics and logs as sync.
func (e *Engine) ensure(ctx context.Context, u *unit, a fix.Actuator, full bool) (err error) {
	id := u.st.fix.ID()
	start := e.now()
	defer func() { err = e.account(ctx, u, fix.NodeBackend, start, err) }()
	res, err := a.Ensure(ctx, e.snapshot(u.st.reads), full)
	if err != nil {
		return fmt.Errorf("ensure: %w", err)
	}
	e.report(u, res.Report)
	e.mu.Lock()
	u.more = res.More
	e.mu.Unlock()
	switch {
	case res.Repaired:
		e.log.Warn("node state changed behind our back; restored it", "fix", id)
		e.m.Repairs.WithLabelValues(id, fix.NodeBackend, "").Inc()
	case res.Changed:
		e.log.Info("node state changed", "fix", id)
	}
	if o, ok := u.st.fix.(fix.Observer); ok {
		o.Observe(ctx, "", res.Report)
	}
	return nil
}

// account records the outcome of a sync or ensure in the metrics and the unit's status. An error
// caused by ctx ending is returned as ctx's error and not recorded.
func (e *Engine) account(ctx context.Context, u *unit, bname string, start time.Time, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	id := u.st.fix.ID()
	now := e.now()
	e.noteBlocked(u, err)
	e.m.Duration.WithLabelValues(id, bname).Observe(now.Sub(start).Seconds())
	e.m.Syncs.WithLabelValues(id, bname).Inc()
	if err != nil {
		e.m.Errors.WithLabelValues(id, bname).Inc()
		e.notify.FixSyncFailed(id, fmt.Errorf("%s: %w", u.where(), err))
		if u.family != "" {
			e.log.Error("sync failed; previous rules stay in place", "fix", id, "family", u.family, "err", err)
		} else {
			e.log.Error("sync failed", "fix", id, "err", err)
		}
	}
	// Told after e.mu is released (deferred calls run last in, first out).
	firstSync := false
	defer func() {
		if firstSync {
			e.notify.FixSynced(id)
		}
	}()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		u.lastErr = err
		return err
	}
	first := !u.everOK
	u.lastOK, u.lastErr, u.everOK, u.okBackend = now, nil, true, bname
	// The fix's last success is its least recent unit's, once every wanted unit has one.
	oldest := now
	for _, o := range u.st.units {
		if !e.wantedLocked(o) {
			continue
		}
		if !o.everOK {
			return nil
		}
		if o.lastOK.Before(oldest) {
			oldest = o.lastOK
		}
	}
	e.m.LastSuccess.WithLabelValues(id, bname).Set(float64(oldest.UnixNano()) / 1e9)
	// This unit was the fix's last to sync since the fix became wanted.
	firstSync = first
	return nil
}

// remove takes away what an unwanted unit left: the fix's rules in the family, or an Actuator's
// node state (Revert).
func (e *Engine) remove(ctx context.Context, u *unit) error {
	id := u.st.fix.ID()
	var err error
	if u.st.act != nil {
		if err = u.st.act.Revert(ctx); err != nil {
			err = fmt.Errorf("revert: %w", err)
		}
	} else if _, err = e.be.Reconcile(ctx, id, u.family, nil, backend.Trust); err != nil {
		// Trust: the backend (its Driver) is the one that knows a unit is already empty, and
		// then does nothing.
		err = fmt.Errorf("remove: %w", err)
	} else {
		e.m.Rules.WithLabelValues(id, e.be.Name(), string(u.family)).Set(0)
		e.noteBlocked(u, nil)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e.log.Error("cannot remove what a disabled fix left; retrying", "fix", id, "family", u.family, "err", err)
		return err
	}
	if u.st.act != nil {
		e.mu.Lock()
		u.reverted = true
		e.mu.Unlock()
	}
	return nil
}

// report exports a fix's report and logs its skips when they change.
func (e *Engine) report(u *unit, r fix.Report) {
	id, fam := u.st.fix.ID(), string(u.family)
	e.m.Covered.WithLabelValues(id, fam).Set(float64(r.Covered))
	byReason := map[string]int{}
	var sig strings.Builder
	for _, s := range r.Skipped {
		byReason[s.Reason]++
		fmt.Fprintf(&sig, "%s|%s|%s\n", s.Object, s.Reason, s.Detail)
	}
	e.mu.Lock()
	prev := u.skipSig
	changed := prev != sig.String()
	u.skipSig = sig.String()
	e.mu.Unlock()
	if changed {
		e.m.Skipped.DeletePartialMatch(map[string]string{"fix": id, "family": fam})
		was := map[string]bool{}
		for l := range strings.Lines(prev) {
			was[l] = true
		}
		for _, s := range r.Skipped {
			e.log.Warn("skipped", "fix", id, "family", fam, "object", s.Object, "reason", s.Reason, "detail", s.Detail)
			if s.Object != "" && !was[s.Object+"|"+s.Reason+"|"+s.Detail+"\n"] {
				e.notify.ObjectSkipped(id, fam, s) // an Event naming the object, for new skips only
			}
		}
	}
	for reason, n := range byReason {
		e.m.Skipped.WithLabelValues(id, fam, reason).Set(float64(n))
	}
}
