package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/config"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// fixState is one registered fix and what the config says about it.
type fixState struct {
	fix fix.Fix
	// Exactly one of rules and act is set: the contract the fix implements (fix.As).
	rules   fix.RuleFix
	act     fix.Actuator
	enabled bool
	refusal error
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
	removed bool // an unwanted unit whose rules are known to be gone
	skipSig string
	// waiting: wanted, but the watches its fix reads have not synced; it does nothing meanwhile and
	// its fix counts as not running (nnm_fix_enabled 0).
	waiting bool
	// more: the Actuator's last Ensure stopped at a bound with work left (fix.Result.More).
	more bool
	beat time.Time // the worker's last heartbeat
	busy time.Time // when the pass in progress started (zero: none)

	// computed is the fix's last successful Rules in this family; guarded by run.
	computed computed
}

// computed is what a RuleFix's Rules returned for the inputs at (source version, config generation).
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
// or that is neither or both a RuleFix and an Actuator, is refused with an error naming it.
func register(f fix.Fix, registered []*fixState) (*fixState, error) {
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
	st := &fixState{fix: f, rules: r, act: a}
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
	pods, err := cfg.ParsedPodCIDRs()
	if err != nil {
		return err
	}
	svcCIDRs, err := cfg.ParsedServiceCIDRs()
	if err != nil {
		return err
	}
	for i, st := range e.fixes {
		if err := st.fix.Configure(cfg.FixOptions(st.fix.ID())); err != nil {
			// Fixes configured before this one took the new options: give them the running ones
			// back, so that a rejected configuration changes nothing.
			if e.cfg != nil {
				for _, done := range e.fixes[:i] {
					if rerr := done.fix.Configure(e.cfg.FixOptions(done.fix.ID())); rerr != nil {
						e.log.Error("cannot restore the running options of a fix", "fix", done.fix.ID(), "err", rerr)
					}
				}
			}
			return cfg.FixError(st.fix.ID(), err)
		}
	}
	e.cfg = cfg
	e.cfgGen++
	e.families = cfg.ParsedFamilies()
	e.podCIDRs = pods
	e.serviceCIDRs = svcCIDRs
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
				u.removed = false
				if !wasWanted[i] && needsOf(st.fix) != (fix.Needs{}) {
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
	return nil
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

// Needs is what the enabled fixes read.
func (e *Engine) Needs() fix.Needs {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.needsLocked()
}

func (e *Engine) needsLocked() fix.Needs {
	var n fix.Needs
	for _, st := range e.fixes {
		if st.enabled {
			n = merge(n, needsOf(st.fix))
		}
	}
	return n
}

// needsOf is what a fix's snapshot is built from: the Node gives pod CIDRs, which the snapshot
// offers to every fix that reads Services.
func needsOf(f fix.Fix) fix.Needs {
	n := f.Needs()
	n.Node = n.Node || n.Services
	return n
}

func merge(a, b fix.Needs) fix.Needs {
	return fix.Needs{Services: a.Services || b.Services, Node: a.Node || b.Node, Pods: a.Pods || b.Pods,
		ServiceCIDRs: a.ServiceCIDRs || b.ServiceCIDRs}
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
	oldNeeds := e.needsLocked()
	err := e.configure(cfg)
	needs := e.needsLocked()
	e.mu.Unlock()
	if err == nil && needs != oldNeeds && merge(needs, oldNeeds) != oldNeeds {
		if serr := e.source.Start(ctx, needs); serr != nil {
			err = fmt.Errorf("config: %s: cannot start the watches they read (%s): %w", e.newlyNeeding(oldNeeds), describeNeeds(needs), serr)
			e.mu.Lock()
			if rerr := e.configure(old); rerr != nil {
				e.log.Error("cannot restore the running configuration", "err", rerr)
			}
			e.mu.Unlock()
		} else {
			e.mu.Lock()
			e.watchErr = nil
			e.mu.Unlock()
			e.log.Info("started the watches the new set of fixes reads", "needs", describeNeeds(needs))
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

// newlyNeeding names the enabled fixes that read a watch outside old ("fix mss-clamp (Node)").
func (e *Engine) newlyNeeding(old fix.Needs) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, st := range e.fixes {
		n := needsOf(st.fix)
		extra := fix.Needs{Services: n.Services && !old.Services, Node: n.Node && !old.Node, Pods: n.Pods && !old.Pods}
		if st.enabled && extra != (fix.Needs{}) {
			out = append(out, fmt.Sprintf("fix %s (%s)", st.fix.ID(), describeNeeds(extra)))
		}
	}
	return strings.Join(out, ", ")
}

// describeNeeds names the watches of n: "Services, Node".
func describeNeeds(n fix.Needs) string {
	var out []string
	for _, w := range []struct {
		on   bool
		name string
	}{{n.Services, "Services"}, {n.Node, "Node"}, {n.Pods, "Pods"}} {
		if w.on {
			out = append(out, w.name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
