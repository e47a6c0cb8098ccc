// Package engine is the sync loop: it turns watch changes into snapshots, asks every enabled fix for
// its rules per family, and hands them to the rule backend.
//
// Changes are coalesced and applied at most once per minSyncPeriod; every syncPeriod a full resync
// checks that the kernel still holds what was applied and restores it if not. A failed apply is
// retried with backoff; the rules applied before stay in place. Rules are never removed because the
// process exits; a disabled fix's rules are removed at start and when the config changes.
//
// A fix that implements fix.Actuator (node state other than rules, e.g. a sysctl) takes the same
// path with Ensure once per pass in place of Rules+Apply per family, and Revert in place of Remove.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/config"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/watch"
)

// Options are the engine's collaborators.
type Options struct {
	Fixes   []fix.Fix
	Backend backend.Backend
	Source  watch.Source
	Config  *config.Config
	Env     fix.Env
	Metrics *metrics.Sync
	Log     *slog.Logger
	// Now is time.Now unless a test replaces it.
	Now func() time.Time
}

type fixState struct {
	fix     fix.Fix
	enabled bool
	refusal error
	skipSig map[rules.Family]string
	lastOK  time.Time
	lastErr error
	// enabledAt is when the fix last went from disabled to enabled (health counts from there).
	enabledAt time.Time
}

// Engine runs the sync loop. Create it with New, then Start and Stop it (fx lifecycle).
type Engine struct {
	be     backend.Backend
	source watch.Source
	m      *metrics.Sync
	log    *slog.Logger
	now    func() time.Time

	reconfig chan *config.Config

	mu       sync.Mutex // guards everything below
	cfg      *config.Config
	env      fix.Env
	families []rules.Family
	podCIDRs []netip.Prefix
	// podCIDRSource is where the last snapshot's pod CIDRs came from ("node", "config"), for logging.
	podCIDRSource string
	fixes         []*fixState
	started       time.Time
	ready         bool
	synced        bool
	lastPass      time.Time
	lastPassE     error
	// removalPending is set while removing a disabled fix's rules keeps failing.
	removalPending bool

	cancel context.CancelFunc
	done   chan struct{}
}

// New validates the options and configures every fix. It does no I/O.
func New(o Options) (*Engine, error) {
	if o.Backend == nil || o.Source == nil || o.Config == nil || o.Metrics == nil {
		return nil, errors.New("engine: backend, source, config and metrics are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	e := &Engine{be: o.Backend, source: o.Source, m: o.Metrics, log: o.Log, now: o.Now,
		reconfig: make(chan *config.Config, 1), env: o.Env}
	seen := map[string]bool{}
	for _, f := range o.Fixes {
		id := f.ID()
		if !rules.ValidFixID(id) {
			return nil, fmt.Errorf("engine: fix id %q is not kebab-case", id)
		}
		if seen[id] {
			return nil, fmt.Errorf("engine: fix %s registered twice", id)
		}
		seen[id] = true
		e.fixes = append(e.fixes, &fixState{fix: f, skipSig: map[rules.Family]string{}})
	}
	// Value groups arrive in random order: sort so that logs, metrics and sync order are stable.
	slices.SortFunc(e.fixes, func(a, b *fixState) int { return strings.Compare(a.fix.ID(), b.fix.ID()) })
	if err := e.configure(o.Config); err != nil {
		return nil, err
	}
	return e, nil
}

// configure takes a configuration: validates every fix's options and works out which fixes run.
// Nothing changes unless every fix accepted its options.
func (e *Engine) configure(cfg *config.Config) error {
	pods, err := cfg.ParsedPodCIDRs()
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
			if strings.HasPrefix(err.Error(), "fixes."+st.fix.ID()) {
				return fmt.Errorf("config: %w", err)
			}
			return fmt.Errorf("config: fixes.%s: %w", st.fix.ID(), err)
		}
	}
	e.cfg = cfg
	e.families = cfg.ParsedFamilies()
	e.podCIDRs = pods
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
		st.enabled = enabled
		v := 0.0
		if enabled {
			v = 1
		}
		e.m.Enabled.WithLabelValues(id).Set(v)
		refused := 0.0
		if st.refusal != nil {
			refused = 1
		}
		e.m.Refused.WithLabelValues(id).Set(refused)
	}
	return nil
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
			need := st.fix.Needs()
			n.Services = n.Services || need.Services
			n.Node = n.Node || need.Node
			n.Pods = n.Pods || need.Pods
		}
	}
	// The Node gives pod CIDRs, which the snapshot offers to every fix that reads Services.
	n.Node = n.Node || n.Services
	return n
}

// Start starts the source and the loop. It returns at once; the first sync happens in the loop.
func (e *Engine) Start(ctx context.Context) error {
	for _, err := range e.Refusals() {
		e.log.Error("fix not started", "err", err)
	}
	e.mu.Lock()
	e.started = e.now()
	needs := e.needsLocked()
	e.mu.Unlock()
	// The loop outlives the Start hook's context: it has its own, cancelled by Stop.
	loopCtx, cancel := context.WithCancel(context.Background())
	if err := e.source.Start(loopCtx, needs); err != nil {
		cancel()
		return fmt.Errorf("engine: start watches: %w", err)
	}
	e.cancel = cancel
	e.done = make(chan struct{})
	go func() {
		defer close(e.done)
		e.run(loopCtx)
	}()
	return nil
}

// Stop ends the loop and the watches and waits for them. Rules stay in the kernel.
func (e *Engine) Stop(ctx context.Context) error {
	if e.cancel == nil {
		return nil
	}
	e.cancel()
	select {
	case <-e.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.source.Stop()
	return nil
}

// Reconfigure hands a new configuration to the loop (e.g. after the config file changed).
func (e *Engine) Reconfigure(cfg *config.Config) {
	select {
	case <-e.reconfig:
	default:
	}
	e.reconfig <- cfg
}

func (e *Engine) run(ctx context.Context) {
	for {
		if err := e.source.WaitForSync(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			return
		}
	}
	e.mu.Lock()
	e.synced = true
	e.mu.Unlock()
	e.removeDisabled(ctx)

	var last time.Time
	pending, full := true, true
	backoff := time.Duration(0)
	var retry <-chan time.Time
	resync := time.NewTicker(e.syncPeriod())
	defer resync.Stop()
	for {
		if pending {
			if wait := e.minSyncPeriod() - e.now().Sub(last); wait > 0 && !last.IsZero() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			drain(e.source.Changes())
			failed := e.SyncOnce(ctx, full)
			last = e.now()
			pending, full = false, false
			retry = nil
			if failed {
				backoff = nextBackoff(backoff, e.minSyncPeriod(), e.syncPeriod())
				e.log.Info("sync failed; retrying", "in", backoff)
				retry = time.After(backoff)
			} else {
				backoff = 0
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-e.source.Changes():
			pending = true
		case <-resync.C:
			pending, full = true, true
		case <-retry:
			pending, full = true, true
		case cfg := <-e.reconfig:
			if e.applyConfig(ctx, cfg) {
				resync.Reset(e.syncPeriod())
				pending, full = true, true
			}
		}
	}
}

func drain(c <-chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
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

// applyConfig switches to cfg if every fix accepts it; reports whether anything was taken.
func (e *Engine) applyConfig(ctx context.Context, cfg *config.Config) bool {
	e.mu.Lock()
	old := e.cfg
	oldNeeds := e.needsLocked()
	err := e.configure(cfg)
	needs := e.needsLocked()
	e.mu.Unlock()
	if err != nil {
		e.log.Error("new configuration rejected; keeping the running one", "err", err)
		e.m.ConfigReloads.WithLabelValues("error").Inc()
		return false
	}
	e.m.ConfigReloads.WithLabelValues("success").Inc()
	for _, field := range config.RestartOnly(old, cfg) {
		e.log.Warn("config change needs a restart to take effect", "key", field)
	}
	if needs != oldNeeds {
		e.log.Warn("the new set of fixes needs other watches; restart the agent to start them", "needs", needs)
	}
	for _, err := range e.Refusals() {
		e.log.Error("fix not started", "err", err)
	}
	e.log.Info("configuration reloaded", "file", cfg.File)
	e.removeDisabled(ctx)
	return true
}

// removeDisabled removes the rules of disabled fixes in every family, and of enabled fixes in the
// families that are not configured. Disabled Actuators are reverted instead.
//
// A removal that fails is retried on every full pass (and fails the pass, so the retry backoff
// applies) until it succeeds: a disabled fix must not keep filtering traffic.
func (e *Engine) removeDisabled(ctx context.Context) error {
	e.mu.Lock()
	type job struct {
		st  *fixState
		fam rules.Family
	}
	var jobs []job
	var reverts []fix.Actuator
	var revertIDs []string
	for _, st := range e.fixes {
		if a, ok := st.fix.(fix.Actuator); ok {
			// Node state is not per family: revert once, and only when the fix is disabled.
			if !st.enabled {
				reverts = append(reverts, a)
				revertIDs = append(revertIDs, st.fix.ID())
			}
			continue
		}
		for _, fam := range rules.Families {
			if !st.enabled || !slices.Contains(e.families, fam) {
				jobs = append(jobs, job{st, fam})
			}
		}
	}
	e.mu.Unlock()
	var errs []error
	for i, a := range reverts {
		if err := a.Revert(ctx); err != nil {
			e.log.Error("cannot revert disabled fix", "fix", revertIDs[i], "err", err)
			errs = append(errs, fmt.Errorf("fix %s: revert: %w", revertIDs[i], err))
		}
	}
	for _, j := range jobs {
		id := j.st.fix.ID()
		if _, err := e.be.Reconcile(ctx, id, j.fam, nil, backend.Verify); err != nil {
			e.log.Error("cannot remove rules of disabled fix", "fix", id, "family", j.fam, "err", err)
			errs = append(errs, fmt.Errorf("fix %s (%s): remove: %w", id, j.fam, err))
			continue
		}
		e.m.Rules.WithLabelValues(id, e.be.Name(), string(j.fam)).Set(0)
	}
	err := errors.Join(errs...)
	e.mu.Lock()
	e.removalPending = err != nil
	e.mu.Unlock()
	return err
}

// Snapshot builds the view that fixes see now.
func (e *Engine) Snapshot() *fix.Snapshot {
	e.mu.Lock()
	needs := e.needsLocked()
	env := e.env
	cfgCIDRs := e.podCIDRs
	e.mu.Unlock()
	snap := &fix.Snapshot{Env: env}
	if needs.Services {
		snap.Services = e.source.Services()
	}
	if needs.Pods {
		snap.Pods = e.source.Pods()
	}
	snap.Node = e.source.Node()
	snap.PodCIDRs = PodCIDRs(snap.Node, nil)
	from := "node"
	if len(snap.PodCIDRs) == 0 {
		snap.PodCIDRs, from = cfgCIDRs, "config"
	}
	e.notePodCIDRSource(from, snap.Node != nil, snap.PodCIDRs)
	return snap
}

// notePodCIDRSource logs once when the pod CIDRs change between the Node's and the configured ones
// (e.g. the Node object was deleted under the agent), not on every sync.
func (e *Engine) notePodCIDRSource(from string, haveNode bool, cidrs []netip.Prefix) {
	e.mu.Lock()
	prev := e.podCIDRSource
	e.podCIDRSource = from
	e.mu.Unlock()
	switch {
	case from == prev:
	case from == "node":
		e.log.Info("pod CIDRs from the Node object", "podCIDRs", cidrs)
	case prev == "node" && !haveNode:
		e.log.Warn("the Node object is gone; falling back to the configured podCIDRs", "podCIDRs", cidrs)
	case prev == "node":
		e.log.Warn("the Node object has no spec.podCIDRs any more; falling back to the configured podCIDRs", "podCIDRs", cidrs)
	default:
		e.log.Info("the Node object has no pod CIDRs (yet); using the configured podCIDRs", "podCIDRs", cidrs, "nodeSeen", haveNode)
	}
}

// PodCIDRs returns the node's spec.podCIDRs when it has any, else the configured ones.
func PodCIDRs(node *corev1.Node, configured []netip.Prefix) []netip.Prefix {
	if node != nil {
		var out []netip.Prefix
		for _, s := range node.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p.Masked())
			}
		}
		if len(out) == 0 && node.Spec.PodCIDR != "" {
			if p, err := netip.ParsePrefix(node.Spec.PodCIDR); err == nil {
				out = append(out, p.Masked())
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return configured
}

// SyncOnce runs one pass over every enabled fix and family. A full pass also checks that rules which
// did not change are still in the kernel. It reports whether any fix failed.
func (e *Engine) SyncOnce(ctx context.Context, full bool) (failed bool) {
	snap := e.Snapshot()
	e.mu.Lock()
	fams := slices.Clone(e.families)
	var states []*fixState
	for _, st := range e.fixes {
		if st.enabled {
			states = append(states, st)
		}
	}
	e.mu.Unlock()
	var passErr error
	e.mu.Lock()
	retryRemoval := full && e.removalPending
	e.mu.Unlock()
	if retryRemoval {
		passErr = e.removeDisabled(ctx)
	}
	for _, st := range states {
		ok := true
		bname := e.be.Name()
		if a, isActuator := st.fix.(fix.Actuator); isActuator {
			bname = fix.NodeBackend
			if err := e.ensureFix(ctx, st, a, snap, full); err != nil {
				ok = false
				passErr = errors.Join(passErr, err)
			}
		} else {
			for _, fam := range fams {
				if err := e.syncFix(ctx, st, fam, snap, full); err != nil {
					ok = false
					passErr = errors.Join(passErr, err)
				}
			}
		}
		e.mu.Lock()
		if ok {
			st.lastOK = e.now()
			st.lastErr = nil
			e.m.LastSuccess.WithLabelValues(st.fix.ID(), bname).Set(float64(st.lastOK.UnixNano()) / 1e9)
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.lastPass, e.lastPassE = e.now(), passErr
	e.ready = e.ready || passErr == nil
	e.mu.Unlock()
	return passErr != nil
}

func (e *Engine) syncFix(ctx context.Context, st *fixState, fam rules.Family, snap *fix.Snapshot, full bool) (err error) {
	id := st.fix.ID()
	bname := e.be.Name()
	start := e.now()
	defer func() {
		e.m.Duration.WithLabelValues(id, bname).Observe(e.now().Sub(start).Seconds())
		e.m.Syncs.WithLabelValues(id, bname).Inc()
		if err != nil {
			e.m.Errors.WithLabelValues(id, bname).Inc()
			e.mu.Lock()
			st.lastErr = err
			e.mu.Unlock()
			e.log.Error("sync failed; previous rules stay in place", "fix", id, "family", fam, "err", err)
		}
	}()
	rs, report, err := st.fix.Rules(snap, fam)
	if err != nil {
		return fmt.Errorf("fix %s (%s): compute rules: %w", id, fam, err)
	}
	e.report(st, fam, report)
	mode := backend.Trust
	if full {
		mode = backend.Verify
	}
	res, err := e.be.Reconcile(ctx, id, fam, rs, mode)
	if err != nil {
		return fmt.Errorf("fix %s (%s): %w", id, fam, err)
	}
	if res.Repaired {
		e.log.Warn("rules changed behind our back; restored them", "fix", id, "family", fam)
		e.m.Repairs.WithLabelValues(id, bname, string(fam)).Inc()
	}
	if res.Applied && rs != nil {
		e.log.Info("rules applied", "fix", id, "family", fam, "rules", rs.RuleCount())
	}
	n := 0
	if rs != nil {
		n = rs.RuleCount()
	}
	e.m.Rules.WithLabelValues(id, bname, string(fam)).Set(float64(n))
	if o, ok := st.fix.(fix.Observer); ok {
		o.Observe(ctx, fam, report)
	}
	return nil
}

// ensureFix runs one Ensure of an Actuator, with the same metrics and logs as syncFix.
func (e *Engine) ensureFix(ctx context.Context, st *fixState, a fix.Actuator, snap *fix.Snapshot, full bool) (err error) {
	id := st.fix.ID()
	start := e.now()
	defer func() {
		e.m.Duration.WithLabelValues(id, fix.NodeBackend).Observe(e.now().Sub(start).Seconds())
		e.m.Syncs.WithLabelValues(id, fix.NodeBackend).Inc()
		if err != nil {
			e.m.Errors.WithLabelValues(id, fix.NodeBackend).Inc()
			e.mu.Lock()
			st.lastErr = err
			e.mu.Unlock()
			e.log.Error("sync failed", "fix", id, "err", err)
		}
	}()
	res, err := a.Ensure(ctx, snap, full)
	if err != nil {
		return fmt.Errorf("fix %s: ensure: %w", id, err)
	}
	e.report(st, "", res.Report)
	switch {
	case res.Repaired:
		e.log.Warn("node state changed behind our back; restored it", "fix", id)
		e.m.Repairs.WithLabelValues(id, fix.NodeBackend, "").Inc()
	case res.Changed:
		e.log.Info("node state changed", "fix", id)
	}
	if o, ok := st.fix.(fix.Observer); ok {
		o.Observe(ctx, "", res.Report)
	}
	return nil
}

// report exports a fix's report and logs its skips when they change.
func (e *Engine) report(st *fixState, fam rules.Family, r fix.Report) {
	id := st.fix.ID()
	e.m.Covered.WithLabelValues(id, string(fam)).Set(float64(r.Covered))
	byReason := map[string]int{}
	var sig strings.Builder
	for _, s := range r.Skipped {
		byReason[s.Reason]++
		fmt.Fprintf(&sig, "%s|%s|%s\n", s.Object, s.Reason, s.Detail)
	}
	e.mu.Lock()
	changed := st.skipSig[fam] != sig.String()
	st.skipSig[fam] = sig.String()
	e.mu.Unlock()
	if changed {
		e.m.Skipped.DeletePartialMatch(map[string]string{"fix": id, "family": string(fam)})
		for _, s := range r.Skipped {
			e.log.Warn("skipped", "fix", id, "family", fam, "object", s.Object, "reason", s.Reason, "detail", s.Detail)
		}
	}
	for reason, n := range byReason {
		e.m.Skipped.WithLabelValues(id, string(fam), reason).Set(float64(n))
	}
}

// Healthy fails when an enabled fix has not synced successfully for 2 × syncPeriod.
func (e *Engine) Healthy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	limit := 2 * e.cfg.SyncPeriod
	now := e.now()
	var errs []error
	for _, st := range e.fixes {
		if !st.enabled {
			continue
		}
		// Count from the latest of: the last success, the agent's start, the fix being enabled.
		last := st.lastOK
		for _, t := range []time.Time{e.started, st.enabledAt} {
			if t.After(last) {
				last = t
			}
		}
		if age := now.Sub(last); age > limit {
			errs = append(errs, fmt.Errorf("fix %s: no successful sync for %s (limit %s); last error: %v", st.fix.ID(), age.Round(time.Second), limit, st.lastErr))
		}
	}
	return errors.Join(errs...)
}

// Ready succeeds once the watches synced and one sync pass applied every enabled fix.
func (e *Engine) Ready() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case !e.synced:
		return errors.New("watches have not synced yet")
	case !e.ready:
		return fmt.Errorf("no successful sync pass yet: %v", e.lastPassE)
	}
	return nil
}

// Status describes each fix for logs and the `plan`/status output.
type Status struct {
	Fix     string
	Enabled bool
	Refusal error
	LastOK  time.Time
	LastErr error
}

// Statuses returns the status of every registered fix, sorted by id.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Status
	for _, st := range e.fixes {
		out = append(out, Status{Fix: st.fix.ID(), Enabled: st.enabled, Refusal: st.refusal, LastOK: st.lastOK, LastErr: st.lastErr})
	}
	return out
}

// Plan computes every enabled fix's rules for every configured family from the current snapshot,
// touching nothing.
func (e *Engine) Plan() ([]*rules.Ruleset, []fix.Report, error) {
	snap := e.Snapshot()
	e.mu.Lock()
	fams := slices.Clone(e.families)
	var fixes []fix.Fix
	for _, st := range e.fixes {
		if st.enabled {
			fixes = append(fixes, st.fix)
		}
	}
	e.mu.Unlock()
	var out []*rules.Ruleset
	var reports []fix.Report
	for _, f := range fixes {
		if _, ok := f.(fix.Actuator); ok {
			continue // no rules: it changes node state (see Statuses)
		}
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
