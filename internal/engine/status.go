package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ProbeError is one unit's failure in Healthy and Ready. Error is the whole text, with the last
// error (logged by the server); Short leaves that error's text out, since it can hold host paths and
// command output, and the probes answer unauthenticated (/healthz on the node's address): they show
// Short, which says where the details are.
type ProbeError struct {
	Summary string
	Err     error
	sep     string // between Summary and Err in Error; "; last error: " when empty
}

func (e *ProbeError) Error() string {
	if e.Err == nil {
		return e.Summary
	}
	sep := e.sep
	if sep == "" {
		sep = "; last error: "
	}
	return e.Summary + sep + fmt.Sprint(e.Err)
}

// Short is Summary and what kind of problem the last error is, without its text.
func (e *ProbeError) Short() string {
	switch {
	case e.Err == nil:
		return e.Summary
	case errors.Is(e.Err, ErrWaitingForWatches):
		return e.Summary + ": " + ErrWaitingForWatches.Error()
	case errors.Is(e.Err, backend.ErrForeign):
		return e.Summary + ": blocked: an object named like one it makes is not the agent's and is left untouched (nnm_fix_blocked names it)"
	}
	return e.Summary + ": the last sync failed (the error is in the agent's log, the count in nnm_sync_errors_total)"
}

// noteBlocked keeps nnm_fix_blocked of a rule unit: 1, naming the object, while its last sync was
// refused because an object of the name one of its objects must have is someone else's
// (backend.ForeignError); no sample otherwise (err nil: it synced, or was removed).
func (e *Engine) noteBlocked(u *unit, err error) {
	if u.family == "" {
		return
	}
	id, fam := u.st.fix.ID(), string(u.family)
	e.m.Blocked.DeletePartialMatch(prometheus.Labels{"fix": id, "family": fam})
	var fe *backend.ForeignError
	if errors.As(err, &fe) {
		e.m.Blocked.WithLabelValues(id, fam, fe.Object).Set(1)
	}
}

// ErrWaitingForWatches is the last error of a fix that reads the API while its watches have not synced.
var ErrWaitingForWatches = errors.New("waiting for the watches it reads to sync (see the API errors logged)")

// Healthy fails when a unit of an enabled fix has not synced successfully for 2 × syncPeriod,
// naming the fix, the family and the last error. Each unit counts on its own: one blocked fix or
// family does not make another look unhealthy. For monitoring (/healthz).
func (e *Engine) Healthy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	limit := 2 * e.cfg.SyncPeriod
	now := e.now()
	var errs []error
	for _, u := range e.units {
		if !e.wantedLocked(u) {
			continue
		}
		// Count from the latest of: the last success, the agent's start, the fix being enabled.
		last := u.lastOK
		for _, t := range []time.Time{e.started, u.st.enabledAt} {
			if t.After(last) {
				last = t
			}
		}
		if age := now.Sub(last); age > limit {
			errs = append(errs, &ProbeError{Summary: fmt.Sprintf("%s: no successful sync for %s (limit %s)", u.where(), age.Round(time.Second), limit), Err: u.lastErr})
		}
	}
	return errors.Join(errs...)
}

// Ready succeeds once every unit of every enabled fix has synced successfully (/readyz).
func (e *Engine) Ready() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, u := range e.units {
		if e.wantedLocked(u) && !u.everOK {
			errs = append(errs, &ProbeError{Summary: u.where() + ": no successful sync yet", Err: u.lastErr, sep: ": "})
		}
	}
	return errors.Join(errs...)
}

// Alive fails when a worker has not come round its loop for 2 × syncPeriod (at least a minute), or
// has been inside one pass for 10 × syncPeriod (at least PassLimitMin): it is stuck, whatever the
// result of its syncs. A worker whose syncs fail, or that waits for the API server, is alive. A pass
// beats nothing while it waits for the kernel, and under load that is long: with 10,000 Services
// on nodes under emulation (make test-cluster's day 2) passes took over a minute, some waiting for
// the xtables lock behind another fix's restores, and the one-minute bound that held them too made
// the kubelet restart the agents, each restart a cold start with the same work. For the liveness
// probe (/livez).
func (e *Engine) Alive() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started.IsZero() {
		return nil
	}
	limit := max(2*e.cfg.SyncPeriod, time.Minute)
	passLimit := max(10*e.cfg.SyncPeriod, PassLimitMin)
	now := e.now()
	var errs []error
	for _, u := range e.units {
		if !u.busy.IsZero() {
			if age := now.Sub(u.busy); age > passLimit {
				errs = append(errs, fmt.Errorf("worker of fix %s stuck in one pass for %s (limit %s)", u, age.Round(time.Second), passLimit))
			}
			continue
		}
		if age := now.Sub(u.beat); age > limit {
			errs = append(errs, fmt.Errorf("worker of fix %s stuck for %s (limit %s)", u, age.Round(time.Second), limit))
		}
	}
	return errors.Join(errs...)
}

// PassLimitMin is the least time one pass may take before Alive calls its worker stuck.
const PassLimitMin = 5 * time.Minute

// Status describes each fix for logs and the `plan`/status output.
type Status struct {
	Fix     string
	Enabled bool
	// NodeState says the fix is a fix.Actuator: it changes node state, not rules (Plan has none).
	NodeState bool
	Refusal   error
	// LastOK is the least recent last success of the fix's units (zero until each has one).
	LastOK time.Time
	// LastErr joins its units' last errors.
	LastErr error
	// Backend is the backend with which every wanted unit of the fix last synced successfully; ""
	// when they differ or one has not synced (after a backend switch, until each has synced again).
	Backend string
	// Units is the status of each wanted unit: one per family for a rule fix, one without a family
	// for a node-state fix.
	Units []UnitStatus
}

// UnitStatus is the status of one unit (a fix in one family, or a node-state fix): whether its
// last sync succeeded, and when it last did.
type UnitStatus struct {
	// Family is the unit's family; "" for a node-state fix.
	Family rules.Family
	// Synced: it synced successfully since it became wanted.
	Synced bool
	// Waiting: the inputs its fix reads have not synced yet, so it has not run.
	Waiting bool
	// LastOK is its last successful sync (zero: none).
	LastOK time.Time
	// LastErr is its last sync's error; nil when the last sync succeeded.
	LastErr error
	// Backend is the backend of its last successful sync ("node" for a node-state fix).
	Backend string
}

// Statuses returns the status of every registered fix, sorted by id.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Status
	for _, st := range e.fixes {
		s := Status{Fix: st.fix.ID(), Enabled: st.enabled, NodeState: st.act != nil, Refusal: st.refusal}
		var errs []error
		first := true
		for _, u := range st.units {
			if !e.wantedLocked(u) {
				continue
			}
			if first || u.lastOK.Before(s.LastOK) {
				s.LastOK = u.lastOK
			}
			switch {
			case first:
				s.Backend = u.okBackend
			case s.Backend != u.okBackend:
				s.Backend = ""
			}
			first = false
			s.Units = append(s.Units, UnitStatus{Family: u.family, Synced: u.everOK, Waiting: u.waiting,
				LastOK: u.lastOK, LastErr: u.lastErr, Backend: u.okBackend})
			if u.lastErr != nil {
				errs = append(errs, fmt.Errorf("%s: %w", u.where(), u.lastErr))
			}
		}
		s.LastErr = errors.Join(errs...)
		out = append(out, s)
	}
	return out
}

// Plan computes every enabled RuleFix's rules for every configured family from the current snapshot,
// touching nothing.
func (e *Engine) Plan() ([]*rules.Ruleset, []fix.Report, error) {
	snap := e.Snapshot()
	e.mu.Lock()
	fams := slices.Clone(e.families)
	var fixes []fix.RuleFix
	for _, st := range e.fixes {
		if st.enabled && st.rules != nil { // an Actuator has no rules (see Statuses)
			fixes = append(fixes, st.rules)
		}
	}
	e.mu.Unlock()
	var out []*rules.Ruleset
	var reports []fix.Report
	for _, f := range fixes {
		for _, fam := range fams {
			rs, rep, err := f.Rules(snap, fam)
			if err != nil {
				return nil, nil, fmt.Errorf("fix %s (%s): %w", f.ID(), fam, err)
			}
			if rs != nil {
				out = append(out, rs)
				reports = append(reports, rep)
			}
		}
	}
	return out, reports, nil
}
