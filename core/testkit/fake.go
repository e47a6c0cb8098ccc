package testkit

import (
	"context"
	"errors"
	"fmt"
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
// Counters behave like kernel rule counters: every successful Apply of (fix, family) resets them to
// zero (the chains are rewritten); SetCounter stands in for traffic.
type FakeBackend struct {
	mu         sync.Mutex
	state      map[fakeKey]*rules.Ruleset
	counters   map[fakeKey]map[string]backend.Counter
	tampered   map[fakeKey]bool
	applyErr   error
	counterErr error
	applies    int
	failed     int
}

type fakeKey struct {
	fix    string
	family rules.Family
}

var _ backend.Backend = (*FakeBackend)(nil)

// NewFakeBackend returns an empty FakeBackend.
func NewFakeBackend() *FakeBackend {
	return &FakeBackend{
		state:    map[fakeKey]*rules.Ruleset{},
		counters: map[fakeKey]map[string]backend.Counter{},
		tampered: map[fakeKey]bool{},
	}
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

// Apply validates rs and then replaces the state of (rs.Fix, rs.Family) with a copy of it.
func (f *FakeBackend) Apply(ctx context.Context, rs *rules.Ruleset) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applies++
	err := f.apply(ctx, rs)
	if err != nil {
		f.failed++
	}
	return err
}

func (f *FakeBackend) apply(ctx context.Context, rs *rules.Ruleset) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.applyErr != nil {
		return f.applyErr
	}
	if err := checkRuleset(rs); err != nil {
		return err
	}
	k := fakeKey{rs.Fix, rs.Family}
	for other, ors := range f.state {
		if other.family != rs.Family || other.fix == rs.Fix {
			continue
		}
		for _, c := range rs.Chains {
			if ors.Chain(c.Name) != nil {
				return fmt.Errorf("fix %s: chain %s already exists in %s (owned by fix %s)", rs.Fix, c.Name, rs.Family, other.fix)
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

// InSync is true when (fix, family) was applied and not tampered with since.
func (f *FakeBackend) InSync(ctx context.Context, fix string, family rules.Family) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fakeKey{fix, family}
	_, ok := f.state[k]
	return ok && !f.tampered[k], nil
}

// Remove deletes (fix, family); removing what is not there is not an error.
func (f *FakeBackend) Remove(ctx context.Context, fix string, family rules.Family) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fakeKey{fix, family}
	delete(f.state, k)
	delete(f.counters, k)
	delete(f.tampered, k)
	return nil
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
	cs, ok := f.counters[fakeKey{fix, family}]
	if !ok {
		return nil, fmt.Errorf("fake: counters of %s/%s: %w", fix, family, ErrNotApplied)
	}
	return maps.Clone(cs), nil
}

// Cleanup removes everything.
func (f *FakeBackend) Cleanup(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.state)
	clear(f.counters)
	clear(f.tampered)
	return nil
}

// SetApplyError makes every following Apply fail with err (nil restores normal behaviour).
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
	cs, ok := f.counters[fakeKey{fix, family}]
	if !ok {
		return fmt.Errorf("fake: %s/%s: %w", fix, family, ErrNotApplied)
	}
	if _, ok := cs[name]; !ok {
		return fmt.Errorf("fake: %s/%s has no counter %q", fix, family, name)
	}
	cs[name] = c
	return nil
}

// Tamper simulates someone flushing or changing the objects of (fix, family): InSync becomes false.
func (f *FakeBackend) Tamper(fix string, family rules.Family) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tampered[fakeKey{fix, family}] = true
}

// ApplyCalls counts Apply calls, failed ones included.
func (f *FakeBackend) ApplyCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applies
}

// FailedApplies counts Apply calls that returned an error.
func (f *FakeBackend) FailedApplies() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// Ruleset returns a copy of what (fix, family) holds, or nil.
func (f *FakeBackend) Ruleset(fix string, family rules.Family) *rules.Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	rs, ok := f.state[fakeKey{fix, family}]
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
		if c := strings.Compare(a.fix, b.fix); c != 0 {
			return c
		}
		return strings.Compare(string(a.family), string(b.family))
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
				return fmt.Errorf("fix %s: chain %s rule %d: jump from a %s chain to %s chain %s", rs.Fix, c.Name, i+1, c.Type, byName[r.Verdict.Chain].Type, r.Verdict.Chain)
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
		return fmt.Errorf("fix %s: jump loop %s -> %s", rs.Fix, strings.Join(path, " -> "), c.Name)
	}
	path = append(path, c.Name)
	for i, r := range c.Rules {
		where := fmt.Sprintf("fix %s: chain %s rule %d (reached from hook %s)", rs.Fix, c.Name, i+1, hook)
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
