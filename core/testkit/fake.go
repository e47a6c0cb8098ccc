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

// FakeBackend is an in-memory backend that validates what it is given as strictly as a kernel
// would, applies atomically and dumps deterministically. It is safe for concurrent use.
//
// Beyond rules.Ruleset.Validate it rejects: a chain name another fix already uses in the same family
// (iptables chains share one namespace), jumps between chains of different types (tables), jump loops,
// DNAT reachable from a hook other than prerouting/output, masquerade reachable from a hook other
// than postrouting, and a path-MTU MSS clamp reachable from a hook before the routing decision. A rejected Apply leaves the state unchanged.
//
// It is the production Backend, backend.Driver, over the fake's operations (fakeOps): the same
// code the kernel backends run, every branch of it. Trust takes the record for the state and
// applies nothing when the desired ruleset equals it; a change of map entries goes through Update,
// which the fake refuses as stale (backend.ErrStale) when Tamper changed the objects behind the
// record, so the Driver applies in full; a change of chains Update declines (DeclinedUpdates), as
// the kernel backends decline a change they have no cheap way for; Verify first "reads back"
// (counted by ReadBacks) and repairs what Tamper changed. With UseGeneration the fake numbers its
// commits like the nf_tables generation, so a Verify while nothing else committed proves
// "unchanged" without a read-back, and Tamper moves it; InterfereAfterApply makes someone change
// the objects right after our commit (the read-back finds it: backend.ErrInterfered, and the Driver
// applies once more); RejectObject makes the "kernel" refuse an object's entries (the Driver leaves
// them out and reports them: backend.Result.Rejected). An Update whose record (the ruleset last
// reconciled, which the Driver keeps without copying its entries) no longer equals what the fake
// holds fails: the caller modified the entries of a slice it had handed over.
//
// Counters behave like kernel rule counters: every successful apply of (fix, family) resets them to
// zero (the chains are rewritten); SetCounter stands in for traffic.
type FakeBackend struct {
	*backend.Driver[struct{}]
	k *fakeOps
}

// fakeOps are the fake's backend.Ops over its in-memory state. Without UseGeneration every Verify
// reads back (Matches).
type fakeOps struct {
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
	declined   int
	stale      int // Updates refused as stale
	// gen counts the commits (ours, and Tamper's), read by the Driver when useGen is set.
	gen       uint32
	useGen    bool
	interfere map[fakeKey]int // changes right after our next commits (InterfereAfterApply)
	refuse    map[string]bool // objects whose entries the "kernel" refuses (RejectObject)
}

type fakeKey = backend.Unit

var _ backend.Backend = (*FakeBackend)(nil)

// NewFakeBackend returns an empty FakeBackend.
func NewFakeBackend() *FakeBackend {
	k := &fakeOps{
		state:     map[fakeKey]*rules.Ruleset{},
		counters:  map[fakeKey]map[string]backend.Counter{},
		tampered:  map[fakeKey]bool{},
		interfere: map[fakeKey]int{},
		refuse:    map[string]bool{},
	}
	return &FakeBackend{Driver: backend.New[struct{}](k, k.generation, slog.New(slog.DiscardHandler)), k: k}
}

var errNoGeneration = errors.New("fake: no generation (UseGeneration)")

// generation is the fake's nf_tables generation: none unless UseGeneration.
func (f *fakeOps) generation() (uint32, error) {
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
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.useGen = true
}

// InterfereAfterApply makes someone change the objects of (fix, family) right after each of our
// next n commits there (a flush between our commit and its read-back): the read-back finds it.
func (f *FakeBackend) InterfereAfterApply(fix string, family rules.Family, n int) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.interfere[fakeKey{Fix: fix, Family: family}] = n
}

// RejectObject makes the fake refuse, as a kernel refuses a rule it cannot take, every ruleset with
// a map entry of object (its Comment), until AcceptObject.
func (f *FakeBackend) RejectObject(object string) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.refuse[object] = true
}

// AcceptObject undoes RejectObject.
func (f *FakeBackend) AcceptObject(object string) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	delete(f.k.refuse, object)
}

// Name is "fake".
func (f *fakeOps) Name() string { return "fake" }

// Render validates rs and returns Format(rs).
func (f *fakeOps) Render(rs *rules.Ruleset) (string, error) {
	if err := checkRuleset(rs); err != nil {
		return "", err
	}
	return Format(rs), nil
}

// Begin runs the OnReconcile hook.
func (f *fakeOps) Begin(ctx context.Context, u backend.Unit, mode backend.Mode) error {
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		return hook(ctx, u.Fix, u.Family, mode)
	}
	return nil
}

func (f *fakeOps) Matches(ctx context.Context, u backend.Unit, _ struct{}) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	f.reads++
	return !f.tampered[fakeKey(u)], nil
}

// Update makes a change of map entries from the record without reading. It is refused as stale
// (nothing changed) when Tamper changed the objects behind the record, as a kernel refuses a delete
// of what is gone, and when the "kernel" refuses the new entries; otherwise it declines a change of
// chains.
func (f *fakeOps) Update(_ context.Context, u backend.Unit, _ backend.Prev[struct{}], c backend.Change) (backend.Step[struct{}], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fakeKey(u)
	if held := f.state[k]; held != nil && !f.tampered[k] && !held.Equal(c.From) {
		return backend.Step[struct{}]{}, fmt.Errorf("fake: the record of %s is not what was applied: the entries of a ruleset handed to Reconcile were modified after", u)
	}
	if f.tampered[k] {
		f.stale++
		return backend.Step[struct{}]{}, backend.ErrStale
	}
	if c.Chains {
		f.declined++
		return backend.Step[struct{}]{}, nil
	}
	if f.refused(c.To) != nil {
		f.stale++
		return backend.Step[struct{}]{}, backend.ErrStale
	}
	return f.commit(u, c.To, true)
}

func (f *fakeOps) Apply(ctx context.Context, u backend.Unit, _ backend.Prev[struct{}], desired *rules.Ruleset) (backend.Step[struct{}], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return backend.Step[struct{}]{}, err
	}
	return f.commit(u, desired, false)
}

// Check says whether Apply would take desired, changing nothing.
func (f *fakeOps) Check(_ context.Context, _ backend.Unit, desired *rules.Ruleset) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := checkRuleset(desired); err != nil {
		return err
	}
	return f.refused(desired)
}

// refused is the "kernel's" refusal of rs's entries (RejectObject). Call with f.mu held.
func (f *fakeOps) refused(rs *rules.Ruleset) error {
	if len(f.refuse) == 0 {
		return nil
	}
	for _, m := range rs.Maps {
		for _, e := range m.Entries {
			if f.refuse[e.Comment] {
				return fmt.Errorf("fake: map %s entry %s (%s): %w", m.Name, e.Key(), e.Comment, backend.ErrRejected)
			}
		}
	}
	return nil
}

// commit writes desired for u (counted by ApplyCalls) as one commit; its read-back (Step.Finish)
// finds what InterfereAfterApply scripted. Call with f.mu held.
func (f *fakeOps) commit(u backend.Unit, desired *rules.Ruleset, update bool) (backend.Step[struct{}], error) {
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

func (f *fakeOps) Remove(ctx context.Context, u backend.Unit, _ backend.Prev[struct{}]) (backend.Step[struct{}], error) {
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

func (f *fakeOps) apply(rs *rules.Ruleset) error {
	if f.applyErr != nil {
		return f.applyErr
	}
	if err := checkRuleset(rs); err != nil {
		return err
	}
	if err := f.refused(rs); err != nil {
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
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.hook = hook
}

// StaleRefusals counts the changes built from the record that the fake refused (backend.ErrStale)
// because Tamper had changed the objects behind it.
func (f *FakeBackend) StaleRefusals() int {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	return f.k.stale
}

// ReadBacks counts the Verify reconciles that read the state back.
func (f *FakeBackend) ReadBacks() int {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	return f.k.reads
}

// ErrNotApplied is returned by Counters for a (fix, family) that holds nothing.
var ErrNotApplied = errors.New("nothing applied")

// Counters returns the named counters of the applied ruleset of the unit.
func (f *fakeOps) Counters(_ context.Context, u backend.Unit, _ struct{}, _ bool) (map[string]backend.Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counterErr != nil {
		return nil, f.counterErr
	}
	cs, ok := f.counters[u]
	if !ok {
		return nil, fmt.Errorf("fake: counters of %s/%s: %w", u.Fix, u.Family, ErrNotApplied)
	}
	return maps.Clone(cs), nil
}

// Cleanup removes everything.
func (f *fakeOps) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.state)
	clear(f.counters)
	clear(f.tampered)
	return nil
}

// SetApplyError makes every following apply fail with err (nil restores normal behaviour).
func (f *FakeBackend) SetApplyError(err error) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.applyErr = err
}

// SetCountersError makes every following Counters call fail with err (nil restores it).
func (f *FakeBackend) SetCountersError(err error) {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.counterErr = err
}

// SetCounter sets a counter of the applied ruleset of (fix, family), as traffic would. It fails when
// the applied ruleset has no rule with that Counter name.
func (f *FakeBackend) SetCounter(fix string, family rules.Family, name string, c backend.Counter) error {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	cs, ok := f.k.counters[fakeKey{Fix: fix, Family: family}]
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
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	f.k.tampered[fakeKey{Fix: fix, Family: family}] = true
	f.k.gen++
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// DeclinedUpdates counts the changes that the fake's Update declined (a change of chains, not of
// map entries), which the Driver then applied in full.
func (f *FakeBackend) DeclinedUpdates() int {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	return f.k.declined
}

// ApplyCalls counts the applies that Reconcile attempted (rulesets written), failed ones included.
func (f *FakeBackend) ApplyCalls() int {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	return f.k.applies
}

// FailedApplies counts attempted applies that failed.
func (f *FakeBackend) FailedApplies() int {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	return f.k.failed
}

// Ruleset returns a copy of what (fix, family) holds, or nil.
func (f *FakeBackend) Ruleset(fix string, family rules.Family) *rules.Ruleset {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	rs, ok := f.k.state[fakeKey{Fix: fix, Family: family}]
	if !ok {
		return nil
	}
	return cloneRuleset(rs)
}

// Dump returns everything the fake holds, sorted by fix and family, each in Format's notation.
// An empty fake dumps as "".
func (f *FakeBackend) Dump() string {
	f.k.mu.Lock()
	defer f.k.mu.Unlock()
	keys := slices.Collect(maps.Keys(f.k.state))
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
		b.WriteString(Format(f.k.state[k]))
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
