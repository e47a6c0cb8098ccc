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
// It runs on the production reconcile driver (backend.Driver), like the real backends, and its
// operations take the Driver's every branch: Trust takes the record for the state and applies
// nothing when the desired ruleset equals it; a change goes through Update, which the fake refuses
// as stale (backend.ErrStale) when Tamper changed the objects behind the record, so the Driver
// applies in full; Verify first "reads back" (counted by ReadBacks) and repairs what Tamper
// changed. With UseGeneration the fake numbers its commits like the nf_tables generation, so a
// Verify while nothing else committed proves "unchanged" without a read-back, and Tamper moves it;
// InterfereAfterApply makes someone change the objects right after our commit (the read-back finds
// it: backend.ErrInterfered, and the Driver applies once more).
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
	// gen counts the commits (ours, and Tamper's), read by the Driver when useGen is set.
	stale     int // Updates refused as stale
	gen       uint32
	useGen    bool
	interfere map[fakeKey]int // changes right after our next commits (InterfereAfterApply)
}

type fakeKey = backend.Unit

var _ backend.Backend = (*FakeBackend)(nil)

// NewFakeBackend returns an empty FakeBackend.
func NewFakeBackend() *FakeBackend {
	f := &FakeBackend{
		state:     map[fakeKey]*rules.Ruleset{},
		counters:  map[fakeKey]map[string]backend.Counter{},
		tampered:  map[fakeKey]bool{},
		interfere: map[fakeKey]int{},
	}
	f.driver = backend.NewDriver[struct{}](fakeOps{f}, f.generation, slog.New(slog.DiscardHandler))
	return f
}

var errNoGeneration = errors.New("fake: no generation (UseGeneration)")

// generation is the fake's nf_tables generation: none unless UseGeneration.
func (f *FakeBackend) generation() (uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.useGen {
		return 0, errNoGeneration
	}
	return f.gen, nil
}

// UseGeneration makes the fake number its commits as the nf_tables generation does: a Verify while
// the generation has not moved since the record was stamped reads nothing back.
func (f *FakeBackend) UseGeneration() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.useGen = true
}

// InterfereAfterApply makes someone change the objects of (fix, family) right after each of our
// next n commits there (a flush between our commit and its read-back): the read-back finds it.
func (f *FakeBackend) InterfereAfterApply(fix string, family rules.Family, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.interfere[fakeKey{Fix: fix, Family: family}] = n
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

// fakeOps are the fake's backend.Ops. Without UseGeneration every Verify reads back (Matches).
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

// Update makes the change from the record without reading: refused as stale (nothing changed) when
// Tamper changed the objects behind the record, as a kernel refuses a delete of what is gone.
func (o fakeOps) Update(_ context.Context, u backend.Unit, _ backend.Prev[struct{}], _, desired *rules.Ruleset) (backend.Step[struct{}], error) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tampered[fakeKey(u)] {
		f.stale++
		return backend.Step[struct{}]{}, backend.ErrStale
	}
	return f.commit(u, desired, true)
}

func (o fakeOps) Apply(ctx context.Context, u backend.Unit, _ backend.Prev[struct{}], desired *rules.Ruleset) (backend.Step[struct{}], error) {
	f := o.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return backend.Step[struct{}]{}, err
	}
	return f.commit(u, desired, false)
}

// commit writes desired for u (counted by ApplyCalls) as one commit; its read-back (Step.Finish)
// finds what InterfereAfterApply scripted. Call with f.mu held.
func (f *FakeBackend) commit(u backend.Unit, desired *rules.Ruleset, update bool) (backend.Step[struct{}], error) {
	f.applies++
	if err := f.apply(desired); err != nil {
		f.failed++
		return backend.Step[struct{}]{Unsure: !update}, err
	}
	f.gen++
	k := fakeKey(u)
	step := backend.Step[struct{}]{Done: update, Applied: true, Commits: 1}
	if f.interfere[k] > 0 {
		f.interfere[k]--
		f.tampered[k] = true
		f.gen++ // someone else's commit, right after ours
		step.Finish = func(context.Context) (struct{}, error) {
			return struct{}{}, fmt.Errorf("fake: %s was changed after our commit: %w", u, backend.ErrInterfered)
		}
	}
	return step, nil
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
	if there {
		f.gen++
	}
	return backend.Step[struct{}]{Applied: there, Commits: boolInt(there)}, nil
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

// StaleRefusals counts the changes built from the record that the fake refused (backend.ErrStale)
// because Tamper had changed the objects behind it.
func (f *FakeBackend) StaleRefusals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stale
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

// Tamper simulates someone flushing or changing the objects of (fix, family) (a commit: it moves
// the generation): the next Verify reconcile finds it and repairs it, and a change built from the
// record is refused as stale.
func (f *FakeBackend) Tamper(fix string, family rules.Family) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tampered[fakeKey{Fix: fix, Family: family}] = true
	f.gen++
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
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
