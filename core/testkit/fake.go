package testkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// FakeBackend is an in-memory backend.Backend that validates what it is given as strictly as a kernel
// would, applies atomically and dumps deterministically. It is safe for concurrent use.
//
// Beyond rules.Ruleset.Validate it rejects: a chain name another fix already uses in the same family
// (iptables chains share one namespace), jumps between chains of different types (tables), jump loops,
// DNAT reachable from a hook other than prerouting/output, masquerade reachable from a hook other
// than postrouting, and a path-MTU MSS clamp reachable from a hook before the routing decision. A rejected Apply leaves the state unchanged.
//
// It runs on the production reconcile driver (backend.Driver), like the real backends: Trust takes
// the record for the state and applies nothing when the desired ruleset equals it; Verify first
// "reads back" (counted by ReadBacks) and repairs what Tamper changed.
//
// Counters behave like kernel rule counters: every successful apply of (fix, family) resets them to
// zero (the chains are rewritten); SetCounter stands in for traffic.
type FakeBackend struct {
	driver     *backend.Driver[struct{}]
	mu         sync.Mutex
	state      map[fakeKey]*rules.Ruleset
	counters   map[fakeKey]map[string]backend.Counter
	tampered   map[fakeKey]bool
	applyErr   error
	counterErr error
	hook       func(ctx context.Context, fix string, family rules.Family, mode backend.Mode) error
	applies    int
	failed     int
	reads      int
}

type fakeKey = backend.Unit

var _ backend.Backend = (*FakeBackend)(nil)

// NewFakeBackend returns an empty FakeBackend.
func NewFakeBackend() *FakeBackend {
	f := &FakeBackend{
		state:    map[fakeKey]*rules.Ruleset{},
		counters: map[fakeKey]map[string]backend.Counter{},
		tampered: map[fakeKey]bool{},
	}
	f.driver = backend.NewDriver[struct{}](fakeOps{f}, nil, slog.New(slog.DiscardHandler))
	return f
}

// Name is "fake".
func (f *FakeBackend) Name() string { return "fake" }

// Render validates rs and returns Format(rs).
func (f *FakeBackend) Render(rs *rules.Ruleset) (string, error) {
	if err := checkRuleset(rs); err != nil {
		return "", err
	}
	return Format(rs), nil
}

// Reconcile validates desired and makes the fake hold it for (fix, family) through the production
// driver (backend.Driver), so fix tests run the contract the real backends run. A nil desired
// removes (fix, family).
func (f *FakeBackend) Reconcile(ctx context.Context, fix string, family rules.Family, desired *rules.Ruleset, mode backend.Mode) (backend.Result, error) {
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, fix, family, mode); err != nil {
			return backend.Result{}, err
		}
	}
	return f.driver.Reconcile(ctx, fix, family, desired, mode)
}

// fakeOps are the fake's backend.Ops. It has no generation: every Verify reads back (Matches).
type fakeOps struct{ f *FakeBackend }

func (o fakeOps) Matches(ctx context.Context, u backend.Unit, _ struct{}) (bool, error) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	f.reads++
	return !f.tampered[fakeKey(u)], nil
}

// Update never applies: every change is a whole apply (counted by ApplyCalls).
func (fakeOps) Update(context.Context, backend.Unit, backend.Prev[struct{}], *rules.Ruleset, *rules.Ruleset) (backend.Step[struct{}], error) {
	return backend.Step[struct{}]{}, nil
}

func (o fakeOps) Apply(ctx context.Context, u backend.Unit, _ backend.Prev[struct{}], desired *rules.Ruleset) (backend.Step[struct{}], error) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return backend.Step[struct{}]{}, err
	}
	f.applies++
	if err := f.apply(desired); err != nil {
		f.failed++
		return backend.Step[struct{}]{Unsure: true}, err
	}
	return backend.Step[struct{}]{Applied: true}, nil
}

func (o fakeOps) Remove(ctx context.Context, u backend.Unit, _ backend.Prev[struct{}]) (backend.Step[struct{}], error) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fakeKey(u)
	_, there := f.state[k]
	delete(f.state, k)
	delete(f.counters, k)
	delete(f.tampered, k)
	return backend.Step[struct{}]{Applied: there}, nil
}

func (f *FakeBackend) apply(rs *rules.Ruleset) error {
	if f.applyErr != nil {
		return f.applyErr
	}
	if err := checkRuleset(rs); err != nil {
		return err
	}
	k := fakeKey{Fix: rs.Fix, Family: rs.Family}
	for other, ors := range f.state {
		if other.Family != rs.Family || other.Fix == rs.Fix {
			continue
		}
		for _, c := range rs.Chains {
			if ors.Chain(c.Name) != nil {
				return fmt.Errorf("chain %s already exists in %s (owned by fix %s)", c.Name, rs.Family, other.Fix)
			}
		}
	}
	f.state[k] = cloneRuleset(rs)
	f.tampered[k] = false
	cs := map[string]backend.Counter{}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if r.Counter != "" {
				cs[r.Counter] = backend.Counter{}
			}
		}
	}
	f.counters[k] = cs
	return nil
}

// OnReconcile installs a hook called (without the fake's lock) at the start of every Reconcile: a
// test can block one fix, slow down a Verify or fail one (fix, family). A non-nil error fails that
// Reconcile; nil hook removes it.
func (f *FakeBackend) OnReconcile(hook func(ctx context.Context, fix string, family rules.Family, mode backend.Mode) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = hook
}

// ReadBacks counts the Verify reconciles that read the state back.
func (f *FakeBackend) ReadBacks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// ErrNotApplied is returned by Counters for a (fix, family) that holds nothing.
var ErrNotApplied = errors.New("nothing applied")

// Counters returns the named counters of the applied ruleset of (fix, family).
func (f *FakeBackend) Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counterErr != nil {
		return nil, f.counterErr
	}
	cs, ok := f.counters[fakeKey{Fix: fix, Family: family}]
	if !ok {
		return nil, fmt.Errorf("fake: counters of %s/%s: %w", fix, family, ErrNotApplied)
	}
	return maps.Clone(cs), nil
}

// Cleanup removes everything.
func (f *FakeBackend) Cleanup(ctx context.Context) error {
	f.mu.Lock()
	clear(f.state)
	clear(f.counters)
	clear(f.tampered)
	f.mu.Unlock()
	f.driver.Forget(nil)
	return nil
}

// SetApplyError makes every following apply fail with err (nil restores normal behaviour).
func (f *FakeBackend) SetApplyError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applyErr = err
}

// SetCountersError makes every following Counters call fail with err (nil restores it).
func (f *FakeBackend) SetCountersError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counterErr = err
}

// SetCounter sets a counter of the applied ruleset of (fix, family), as traffic would. It fails when
// the applied ruleset has no rule with that Counter name.
func (f *FakeBackend) SetCounter(fix string, family rules.Family, name string, c backend.Counter) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cs, ok := f.counters[fakeKey{Fix: fix, Family: family}]
	if !ok {
		return fmt.Errorf("fake: %s/%s: %w", fix, family, ErrNotApplied)
	}
	if _, ok := cs[name]; !ok {
		return fmt.Errorf("fake: %s/%s has no counter %q", fix, family, name)
	}
	cs[name] = c
	return nil
}

// Tamper simulates someone flushing or changing the objects of (fix, family): the next Verify
// reconcile finds it and repairs it.
func (f *FakeBackend) Tamper(fix string, family rules.Family) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tampered[fakeKey{Fix: fix, Family: family}] = true
}

// ApplyCalls counts the applies that Reconcile attempted (rulesets written), failed ones included.
func (f *FakeBackend) ApplyCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies
}

// FailedApplies counts attempted applies that failed.
func (f *FakeBackend) FailedApplies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// Ruleset returns a copy of what (fix, family) holds, or nil.
func (f *FakeBackend) Ruleset(fix string, family rules.Family) *rules.Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.state[fakeKey{Fix: fix, Family: family}]
	if !ok {
		return nil
	}
	return cloneRuleset(rs)
}

// Dump returns everything the fake holds, sorted by fix and family, each in Format's notation.
// An empty fake dumps as "".
func (f *FakeBackend) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := slices.Collect(maps.Keys(f.state))
	slices.SortFunc(keys, func(a, b fakeKey) int {
		if c := strings.Compare(a.Fix, b.Fix); c != 0 {
			return c
		}
		return strings.Compare(string(a.Family), string(b.Family))
	})
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(Format(f.state[k]))
	}
	return b.String()
}

// checkRuleset is Validate plus what a kernel rejects beyond it.
func checkRuleset(rs *rules.Ruleset) error {
	if rs == nil {
		return errors.New("nil ruleset")
	}
	if err := rs.Validate(); err != nil {
		return err
	}
	byName := map[string]*rules.Chain{}
	for i := range rs.Chains {
		byName[rs.Chains[i].Name] = &rs.Chains[i]
	}
	for _, c := range rs.Chains {
		for i, r := range c.Rules {
			if r.Verdict.Kind == rules.Jump && byName[r.Verdict.Chain].Type != c.Type {
				return fmt.Errorf("chain %s rule %d: jump from a %s chain to %s chain %s", c.Name, i+1, c.Type, byName[r.Verdict.Chain].Type, r.Verdict.Chain)
			}
		}
	}
	// Walk from every hooked chain: loops and verdicts used from the wrong hook.
	for _, c := range rs.Chains {
		if c.Hook == "" {
			continue
		}
		if err := walk(rs, byName, &c, c.Hook, nil); err != nil {
			return err
		}
	}
	return nil
}

func walk(rs *rules.Ruleset, byName map[string]*rules.Chain, c *rules.Chain, hook rules.Hook, path []string) error {
	if slices.Contains(path, c.Name) {
		return fmt.Errorf("jump loop %s -> %s", strings.Join(path, " -> "), c.Name)
	}
	path = append(path, c.Name)
	for i, r := range c.Rules {
		where := fmt.Sprintf("chain %s rule %d (reached from hook %s)", c.Name, i+1, hook)
		switch r.Verdict.Kind {
		case rules.DNAT, rules.DNATLookup:
			if hook != rules.Prerouting && hook != rules.Output {
				return fmt.Errorf("%s: dnat is only valid from prerouting or output", where)
			}
		case rules.Masquerade:
			if hook != rules.Postrouting {
				return fmt.Errorf("%s: masquerade is only valid from postrouting", where)
			}
		case rules.ClampMSS:
			if r.Verdict.MSS == 0 && !rules.ClampsToPMTUFrom(hook) {
				return fmt.Errorf("%s: clamping the MSS to the path MTU is only valid from forward, output or postrouting", where)
			}
		case rules.Jump:
			if err := walk(rs, byName, byName[r.Verdict.Chain], hook, path); err != nil {
				return err
			}
		}
	}
	return nil
}

func cloneRuleset(rs *rules.Ruleset) *rules.Ruleset {
	out := &rules.Ruleset{Fix: rs.Fix, Family: rs.Family}
	for _, c := range rs.Chains {
		nc := c
		nc.Rules = make([]rules.Rule, len(c.Rules))
		for i, r := range c.Rules {
			r.Match.SrcPrefixes = slices.Clone(r.Match.SrcPrefixes)
			r.Match.DstPrefixes = slices.Clone(r.Match.DstPrefixes)
			r.Match.CTStates = slices.Clone(r.Match.CTStates)
			nc.Rules[i] = r
		}
		out.Chains = append(out.Chains, nc)
	}
	for _, m := range rs.Maps {
		out.Maps = append(out.Maps, rules.Map{Name: m.Name, Entries: slices.Clone(m.Entries)})
	}
	return out
}
