package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// fixState is one registered fix and what the config says about it.
type fixState struct {
	fix fix.Fix
	// Exactly one of rules and act is set: the contract the fix implements (fix.As).
	rules fix.RuleFix
	act   fix.Actuator
	// reads are the inputs of the tables the fix reads (Fix.Reads), sorted by table name.
	reads   []inputs.Input
	enabled bool
	refusal error
	// envRefusal is why a change of the environment (kube-proxy's mode, Follow) stopped the fix
	// while it ran, by its Check; kept as its refusal until it runs again.
	envRefusal error
	// enabledAt is when the fix last went from disabled to enabled (health counts from there).
	enabledAt time.Time
	units     []*unit
}

// unit is what one worker keeps in the kernel: the rules of one fix in one family, or the node
// state of an Actuator (family "").
type unit struct {
	st     *fixState
	family rules.Family
	// kick: something the fix reads changed. reconf: the config changed (a full pass).
	kick, reconf chan struct{}
	// run serialises the passes of this unit (its worker, SyncOnce, removals after a reload).
	run sync.Mutex

	// Guarded by Engine.mu.
	lastOK  time.Time
	lastErr error
	everOK  bool // synced successfully since it became wanted
	// reverted: an unwanted Actuator's Revert succeeded. A rule unit has no such mark: its
	// backend knows when it holds nothing (a removal of an empty unit does nothing).
	reverted bool
	skipSig  string
	// waiting: wanted, but the watches its fix reads have not synced; it does nothing meanwhile and
	// its fix counts as not running (nnm_fix_enabled 0).
	waiting bool
	// more: the Actuator's last Ensure stopped at a bound with work left (fix.Result.More).
	more bool
	beat time.Time // the worker's last heartbeat
	seen uint64    // the revision of its fix's inputs when changes were last handed out (wake)
	// busy is when the pass in progress began (zero: none): a pass that waits for the kernel (a
	// long restore, the xtables lock) beats nothing, and Alive bounds it on its own.
	busy time.Time

	// okBackend is the backend of the unit's last successful sync.
	okBackend string

	// computed is the fix's last successful Rules in this family; guarded by run.
	computed computed
}

// computed is what a RuleFix's Rules returned for the inputs at (their revision, config generation).
type computed struct {
	valid   bool
	version uint64
	cfgGen  uint64
	rs      *rules.Ruleset
	report  fix.Report
}

func newUnit(st *fixState, fam rules.Family) *unit {
	return &unit{st: st, family: fam, kick: make(chan struct{}, 1), reconf: make(chan struct{}, 1)}
}

// where names the unit at the head of an error: "fix X (ipv4)", or "fix X" for an Actuator. Errors
// are prefixed with it once, where they leave the engine (events, probes); the operations below
// never name the unit themselves.
func (u *unit) where() string { return "fix " + u.String() }

func (u *unit) String() string {
	if u.family == "" {
		return u.st.fix.ID()
	}
	return u.st.fix.ID() + " (" + string(u.family) + ")"
}

// register checks f against the fixes registered before it and makes its state: a RuleFix gets a
// unit per family, an Actuator one unit without a family. A fix whose id is not kebab-case or taken,
// that is neither or both a RuleFix and an Actuator, or that reads a table no input provides, is
// refused with an error naming it.
func register(f fix.Fix, registered []*fixState, byTable map[string]inputs.Input) (*fixState, error) {
	id := f.ID()
	if !rules.ValidFixID(id) {
		return nil, fmt.Errorf("engine: fix id %q (%T) is not kebab-case", id, f)
	}
	for _, o := range registered {
		if o.fix.ID() == id {
			return nil, fmt.Errorf("engine: fix %s registered twice (%T and %T)", id, o.fix, f)
		}
	}
	r, a, err := fix.As(f)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	reads, err := resolveReads(f, byTable)
	if err != nil {
		return nil, err
	}
	st := &fixState{fix: f, rules: r, act: a, reads: reads}
	if a != nil {
		st.units = []*unit{newUnit(st, "")}
	} else {
		for _, fam := range rules.Families {
			st.units = append(st.units, newUnit(st, fam))
		}
	}
	return st, nil
}

// wantedLocked says whether the unit's fix runs in its family now. Call with e.mu held.
func (e *Engine) wantedLocked(u *unit) bool {
	if !u.st.enabled {
		return false
	}
	return u.family == "" || containsFamily(e.families, u.family)
}

func containsFamily(fams []rules.Family, f rules.Family) bool {
	for _, x := range fams {
		if x == f {
			return true
		}
	}
	return false
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// configure takes a configuration: validates every fix's options and works out which fixes run.
// Nothing changes unless every fix accepted its options. Call with e.mu held (or before Start).
func (e *Engine) configure(cfg *config.Config) error {
	for i, st := range e.fixes {
		ignored, err := cfg.ConfigureFix(st.fix.ID(), st.fix.Configure)
		for _, w := range ignored {
			e.log.Warn("config: " + w)
		}
		if err != nil {
			// Fixes configured before this one took the new options: give them the running ones
			// back, so that a rejected configuration changes nothing.
			if e.cfg != nil {
				for _, done := range e.fixes[:i] {
					if rerr := done.fix.Configure(e.cfg.FixOptions(done.fix.ID())); rerr != nil {
						e.log.Error("cannot restore the running options of a fix", "fix", done.fix.ID(), "err", rerr)
					}
				}
			}
			return err
		}
	}
	e.cfg = cfg
	e.cfgGen++
	e.families = cfg.ParsedFamilies()
	configureInputs(e.ins, cfg)
	e.evaluateLocked()
	return nil
}

// evaluateLocked works out which fixes run under the current configuration and environment (e.cfg,
// e.env): what the config says, else the fix's default for the environment, and not where its Check
// refuses. A fix that kube-proxy's mode stopped while it ran (envRefusal, set by Follow) stays
// refused with that reason until it runs again. Call with e.mu held.
func (e *Engine) evaluateLocked() {
	cfg := e.cfg
	for _, st := range e.fixes {
		id := st.fix.ID()
		enabled, explicit := cfg.FixEnabled(id)
		if !explicit {
			enabled = st.fix.DefaultEnabled(e.env)
		}
		st.refusal = nil
		if c, ok := st.fix.(fix.Checker); ok && enabled {
			if err := c.Check(e.env); err != nil {
				if explicit {
					st.refusal = fmt.Errorf("fix %s refused: %w", id, err)
				}
				enabled = false
			}
		}
		switch {
		case enabled:
			st.envRefusal = nil
		case st.refusal == nil && st.envRefusal != nil:
			st.refusal = st.envRefusal
		}
		if enabled && !st.enabled {
			st.enabledAt = e.now()
		}
		wasWanted := make([]bool, len(st.units))
		for i, u := range st.units {
			wasWanted[i] = e.wantedLocked(u)
		}
		st.enabled = enabled
		for i, u := range st.units {
			if e.wantedLocked(u) {
				u.reverted = false
				if !wasWanted[i] && len(st.reads) > 0 {
					// Until its worker has seen the watches synced, the unit does nothing.
					u.waiting = true
				}
			} else {
				u.everOK, u.waiting = false, false
			}
		}
		e.setEnabledLocked(st)
		refused := 0.0
		if st.refusal != nil {
			refused = 1
		}
		e.m.Refused.WithLabelValues(id).Set(refused)
	}
}

// setEnabledLocked exports whether the fix runs: enabled, not refused, and none of its wanted units
// waiting for the watches it reads. Call with e.mu held.
func (e *Engine) setEnabledLocked(st *fixState) {
	v := 0.0
	if st.enabled {
		v = 1
		for _, u := range st.units {
			if e.wantedLocked(u) && u.waiting {
				v = 0
			}
		}
	}
	e.m.Enabled.WithLabelValues(st.fix.ID()).Set(v)
}

// Refusals returns the errors of fixes that the config enabled but that refused to run here.
func (e *Engine) Refusals() []error {
	var out []error
	for _, st := range e.Statuses() {
		if st.Refusal != nil {
			out = append(out, st.Refusal)
		}
	}
	return out
}

func (e *Engine) minSyncPeriod() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cfg.MinSyncPeriod
}

func (e *Engine) syncPeriod() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cfg.SyncPeriod
}

// applyConfig switches to cfg if every fix accepts it and the watches the newly enabled fixes read
// can be started, and asks every worker for a full pass (which removes what the new config no longer
// wants); reports whether anything was taken. A configuration refused for either reason changes
// nothing: the running one stays, and the refusal is logged, counted and told (ConfigRejected).
func (e *Engine) applyConfig(ctx context.Context, cfg *config.Config) bool {
	before := e.Statuses()
	e.mu.Lock()
	old := e.cfg
	oldReads := e.readLocked()
	err := e.configure(cfg)
	reads := e.readLocked()
	e.mu.Unlock()
	var added []inputs.Input
	for _, in := range reads {
		if !slices.Contains(oldReads, in) {
			added = append(added, in)
		}
	}
	if err == nil && len(added) > 0 {
		if _, serr := e.startInputs(added); serr != nil {
			err = fmt.Errorf("config: %s: cannot start the watches they read (%s): %w", e.newlyReading(oldReads), describe(added), serr)
			e.mu.Lock()
			if rerr := e.configure(old); rerr != nil {
				e.log.Error("cannot restore the running configuration", "err", rerr)
			}
			e.mu.Unlock()
		} else {
			e.mu.Lock()
			e.watchErr = nil
			e.mu.Unlock()
			e.log.Info("started the watches the new set of fixes reads", "tables", describe(added))
		}
	}
	if err != nil {
		e.log.Error("new configuration rejected; keeping the running one", "err", err)
		e.m.ConfigReloads.WithLabelValues("error").Inc()
		e.notify.ConfigRejected(err)
		return false
	}
	e.m.ConfigReloads.WithLabelValues("success").Inc()
	for _, field := range config.RestartOnly(old, cfg) {
		e.log.Warn("config change needs a restart to take effect", "key", field)
	}
	for _, err := range e.Refusals() {
		e.log.Error("fix not started", "err", err)
	}
	e.log.Info("configuration reloaded", "file", cfg.File)
	e.announce(before)
	for _, u := range e.units {
		signal(u.reconf)
	}
	return true
}

// newlyReading names the enabled fixes that read a table outside old ("fix mss-clamp (Node)").
func (e *Engine) newlyReading(old []inputs.Input) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, st := range e.fixes {
		var extra []inputs.Input
		for _, in := range st.reads {
			if !slices.Contains(old, in) {
				extra = append(extra, in)
			}
		}
		if st.enabled && len(extra) > 0 {
			out = append(out, fmt.Sprintf("fix %s (%s)", st.fix.ID(), describe(extra)))
		}
	}
	return strings.Join(out, ", ")
}
