package fix

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ReasonConflict is the skip reason of a map entry that an earlier Service (in namespace/name order)
// already has.
const ReasonConflict = "conflict"

// ServiceMap computes a lookup map (rules.Map entries) from Services incrementally, for fixes whose
// map entries come from Services one by one (e.g. External-IP → Cluster-IP). The fix writes only
// the per-Service function; ServiceMap calls it for the Services that changed since the previous
// call of the same family (for the object that left too: it keeps no entries per Service, so it
// computes them again to release them), keeps the map sorted, and resolves conflicts: when two
// Services want the same (address, protocol, port), the first in namespace/name order keeps it and
// the other gets a ReasonConflict skip.
//
// It relies on the core's rule for Snapshot objects: they are never modified, a changed object is a
// new object (client-go informers replace cached objects on every update). So a Service whose
// pointer did not change since the previous call is not looked at again, and a call with nothing
// changed returns the previous result (the same Entries slice) in time linear in the number of
// Services, without allocating. The result equals a computation from scratch over the same Services
// (TestServiceMapIncrementalEqualsScratch).
//
// In is everything other than the Service the per-Service function reads (options, node data); a
// call with a different In recomputes every Service.
type ServiceMap[In comparable] struct {
	entries func(svc *Service, family rules.Family, in In) ([]rules.MapEntry, []Skip)
	budget  func() Budget

	mu   sync.Mutex
	fams map[rules.Family]*serviceMapState[In]
}

// ServiceMapResult is the map and the report of one ServiceMap.Update.
type ServiceMapResult struct {
	// Entries are the map's entries sorted as rules.Map.Sorted sorts them. The slice is shared with
	// later results while nothing changes: callers must not modify it.
	Entries []rules.MapEntry
	// Report: Covered counts the Services that have at least one entry, Items the distinct
	// addresses, Skipped what the per-Service function left out and the conflicts, by Service in
	// namespace/name order (each Service's own skips first, then its conflicts).
	Report Report
}

// NewServiceMap returns a ServiceMap around entries, the per-Service function: the map entries one
// Service wants in family (in its order of preference) and what of it was left out. It must be
// pure. A Skip's Object may be left empty; it is then set to the Service's namespace/name.
func NewServiceMap[In comparable](entries func(svc *Service, family rules.Family, in In) ([]rules.MapEntry, []Skip)) *ServiceMap[In] {
	return &ServiceMap[In]{entries: entries, budget: func() Budget { return DefaultBudget }, fams: map[rules.Family]*serviceMapState[In]{}}
}

// WithBudget replaces the map's Budget (DefaultBudget); before the first Update.
func (m *ServiceMap[In]) WithBudget(b Budget) *ServiceMap[In] {
	return m.WithBudgetOf(func() Budget { return b })
}

// WithBudgetOf makes the map's Budget what budget returns at each Update (e.g. BudgetFor the
// backend in use, which an agent following kube-proxy replaces); before the first Update. A budget
// other than at the family's previous Update decides again.
func (m *ServiceMap[In]) WithBudgetOf(budget func() Budget) *ServiceMap[In] {
	m.budget = budget
	return m
}

type entryKey struct {
	addr  netip.Addr
	proto rules.Protocol
	port  uint16
}

func keyOf(e *rules.MapEntry) entryKey { return entryKey{e.Addr, e.Protocol, e.Port} }

// compareEntries is rules.CompareEntries' order.
func compareEntries(a, b entryKey) int {
	return rules.CompareEntries(&rules.MapEntry{Addr: a.addr, Protocol: a.proto, Port: a.port}, &rules.MapEntry{Addr: b.addr, Protocol: b.proto, Port: b.port})
}

// svcState is what one Service contributes. Its entries are not kept (at 10,000 Services they would
// be a second copy of the map): they are computed again, the function being pure, for the rare
// moments they are needed (the Service leaves or changes, takes over a contested key, or lost one).
type svcState struct {
	obj     *Service
	skipped []Skip // the per-Service function's own skips
	n       int32  // how many distinct entries it wants
	wins    int32  // how many of them are in the map (the others lost a conflict)
	// admitted: the Budget lets its entries in (they are claimed); over holds the reason when not.
	admitted bool
	over     *Skip
}

func (s *svcState) name() string { return s.obj.Key() }

// svcRef is one Service of the map; st is nil when it contributes nothing (no entries, no skips), so
// that Services a map has no use for cost no more than this.
type svcRef struct {
	obj *Service
	st  *svcState
}

type serviceMapState[In comparable] struct {
	in   In
	svcs []svcRef // sorted by namespace/name
	// spare is the previous call's svcs, cleared, reused for the next one's: with 10,000 Services
	// every change would otherwise allocate a new slice of them (160 KB per change and map).
	spare []svcRef
	// owner is, per key, the Service that has it: the first in namespace/name order of those that
	// want it. contested lists, for the rare keys more than one Service wants, all of them in that
	// order (owner[k] == contested[k][0]).
	owner     map[entryKey]*svcState
	contested map[entryKey][]*svcState
	result    ServiceMapResult
	// refused is a digest of the Services the Budget refused at this family's last Update (it
	// decides over every family's entries, so all families agree when their inputs do); dirty: an
	// Update of another family decided otherwise since, so the next Update of this one decides again
	// even when its Services did not change.
	refused uint64
	dirty   bool
	budget  Budget // at the last Update
}

// Update returns the map and report for services (sorted by namespace/name, as Snapshot.Services
// is) in family.
func (m *ServiceMap[In]) Update(services []*Service, family rules.Family, in In) ServiceMapResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	budget := m.budget()
	st := m.fams[family]
	if st != nil && st.budget != budget {
		st.dirty = true
	}
	if st == nil || st.in != in {
		st = &serviceMapState[In]{in: in, budget: budget, owner: map[entryKey]*svcState{}, contested: map[entryKey][]*svcState{}}
		m.fams[family] = st
	} else if !st.dirty && unchanged(st.svcs, services) {
		return st.result
	}

	wanted := map[*svcState][]rules.MapEntry{} // the entries computed in this call
	entriesOf := func(s *svcState) []rules.MapEntry {
		e, ok := wanted[s]
		if !ok {
			e, _ = m.wanted(s.obj, family, in)
			wanted[s] = e
		}
		return e
	}
	w, sorted := m.walk(st, services, family, in, wanted)
	if !sorted {
		services = slices.Clone(services)
		slices.SortStableFunc(services, CompareServices)
		clear(wanted)
		w, _ = m.walk(st, services, family, in, wanted)
	}
	removed, added := w.removed, w.added
	st.svcs, st.spare = w.next, st.svcs
	clear(st.spare[:cap(st.spare)]) // Services that left are not kept alive by the spare

	before, fresh := m.reassign(st, family, budget, removed, added, entriesOf)
	st.patch(before, fresh, entriesOf)
	st.result.Report = st.report(entriesOf)
	return st.result
}

// reassign updates the owners of the keys for the Services removed and added (and those the Budget
// now lets in or out), and returns who had each touched key before. A map that had no entries (the
// first call, fresh) knows that without a record: every key is new.
func (m *ServiceMap[In]) reassign(st *serviceMapState[In], family rules.Family, budget Budget, removed, added []*svcState,
	entriesOf func(*svcState) []rules.MapEntry) (before map[entryKey]*svcState, fresh bool) {
	fresh = len(st.owner) == 0
	before = map[entryKey]*svcState{}
	releaseAll := func(s *svcState) {
		entries := entriesOf(s)
		for e := range entries {
			k := keyOf(&entries[e])
			if _, ok := before[k]; !ok {
				before[k] = st.owner[k]
			}
			st.release(k, s)
		}
	}
	for _, s := range removed {
		if s.admitted {
			releaseAll(s)
		}
	}
	// The Budget decides, in namespace/name order, whose entries get in: a Service that was in and
	// no longer is (an earlier one grew) releases its keys, one that gets in claims them.
	st.budget = budget
	letIn, letOut := m.admit(st, family, added)
	for _, s := range letOut {
		releaseAll(s)
	}
	for _, s := range letIn {
		entries := entriesOf(s)
		for e := range entries {
			k := keyOf(&entries[e])
			if _, ok := before[k]; !ok && !fresh {
				before[k] = st.owner[k]
			}
			st.claim(k, s)
		}
	}
	return before, fresh
}

// patch moves the keys whose owner changed since before (every key when fresh), and patches the
// sorted entries in one merge.
func (st *serviceMapState[In]) patch(before map[entryKey]*svcState, fresh bool, entriesOf func(*svcState) []rules.MapEntry) {
	type change struct {
		key   entryKey
		entry *rules.MapEntry // nil: the key leaves the map
	}
	n := len(before)
	if fresh {
		n = len(st.owner)
	}
	changes := make([]change, 0, n)
	if fresh {
		for k, now := range st.owner { // none of them was in the map (removed Services had no entries)
			now.wins++
			changes = append(changes, change{key: k, entry: entryOf(entriesOf(now), k)})
		}
	}
	for k, old := range before {
		now := st.owner[k]
		if now == old {
			continue
		}
		if old != nil {
			old.wins--
		}
		ch := change{key: k}
		if now != nil {
			now.wins++
			ch.entry = entryOf(entriesOf(now), k)
		}
		changes = append(changes, ch)
	}
	slices.SortFunc(changes, func(a, b change) int { return compareEntries(a.key, b.key) })
	if len(changes) > 0 {
		old := st.result.Entries
		out := make([]rules.MapEntry, 0, len(old)+len(changes))
		o := 0
		for _, ch := range changes {
			for o < len(old) && compareEntries(keyOf(&old[o]), ch.key) < 0 {
				out = append(out, old[o])
				o++
			}
			if o < len(old) && compareEntries(keyOf(&old[o]), ch.key) == 0 {
				o++ // replaced or removed
			}
			if ch.entry != nil {
				out = append(out, *ch.entry)
			}
		}
		st.result.Entries = append(out, old[o:]...)
	}
}

// admit applies the budget to st.svcs (the new Services, in namespace/name order): it sets each
// state's admitted and over, and returns the states whose keys must now be claimed (added ones let
// in, and kept ones let in again) and those whose keys must be released (kept ones no longer let
// in). added are the states computed in this call, which hold no keys yet.
//
// A Service is let in or refused whole, in every family alike: the budget goes through the Services
// in namespace/name order with their entries in each family the map knows (this one's computed
// now; another family's from its last Update, computed again with that family's input for a
// Service whose object changed since), so that a dual-stack Service is never programmed in one
// family and refused in the other, and the family computed first does not take the map's budget
// from the Services before it in the other. When the other families' last Updates decided otherwise
// (they had not seen these Services, or this family's entries), they are marked to decide again at
// their next Update. A family whose first Update comes before any other family's decides over its
// own entries alone until then (its engine unit computes again when a Service changes).
func (m *ServiceMap[In]) admit(st *serviceMapState[In], family rules.Family, added []*svcState) (in, out []*svcState) {
	svcs := st.svcs
	c := m.countsAcross(family)
	fams, others := c.fams, c.others
	isNew := make(map[*svcState]bool, len(added))
	for _, s := range added {
		isNew[s] = true
	}
	b := st.budget
	total := 0
	nsUsed := make([]int, len(fams))
	ns := ""
	n := make([]int, len(fams))
	var refused maphash.Hash
	refused.SetSeed(refusedSeed)
	for _, ref := range svcs {
		sum := 0
		for i := range fams {
			n[i] = c.count(i, ref)
			sum += n[i]
		}
		if sum == 0 {
			continue
		}
		if ref.obj.Namespace != ns {
			ns = ref.obj.Namespace
			clear(nsUsed)
		}
		over := overBudget(ref, fams, n, nsUsed, total, sum, b)
		if over == nil {
			for i := range fams {
				nsUsed[i] += n[i]
			}
			total += sum
		} else {
			refused.WriteString(over.Object)
			refused.WriteByte(0)
		}
		s := ref.st
		if s == nil || s.n == 0 {
			continue
		}
		was := s.admitted && !isNew[s]
		s.admitted, s.over = over == nil, over
		switch {
		case s.admitted && !was:
			in = append(in, s)
		case !s.admitted && was:
			out = append(out, s)
		}
	}
	st.refused, st.dirty = refused.Sum64(), false
	for _, o := range others {
		if o != nil && o.refused != st.refused {
			o.dirty = true
		}
	}
	return in, out
}

// familyCounts counts the entries a Service wants in each family the map knows, in one order
// whatever family is computed (so the decisions add up alike): the computed family's from its
// state, another family's from its last Update (computed again with that family's input for a
// Service whose object changed since).
type familyCounts[In comparable] struct {
	m       *ServiceMap[In]
	fams    []rules.Family
	others  []*serviceMapState[In] // nil at the computed family
	cursors []int
}

func (m *ServiceMap[In]) countsAcross(family rules.Family) *familyCounts[In] {
	fams := []rules.Family{family}
	for f := range m.fams {
		if f != family {
			fams = append(fams, f)
		}
	}
	slices.Sort(fams)
	c := &familyCounts[In]{m: m, fams: fams, others: make([]*serviceMapState[In], len(fams)), cursors: make([]int, len(fams))}
	for i, f := range fams {
		if f != family {
			c.others[i] = m.fams[f]
		}
	}
	return c
}

// count is how many entries the Service wants in the i-th family; called in namespace/name order.
func (c *familyCounts[In]) count(i int, ref svcRef) int {
	o := c.others[i]
	if o == nil {
		if ref.st == nil {
			return 0
		}
		return int(ref.st.n)
	}
	j := c.cursors[i]
	for j < len(o.svcs) && CompareServices(o.svcs[j].obj, ref.obj) < 0 {
		j++
	}
	c.cursors[i] = j
	if j < len(o.svcs) && o.svcs[j].obj == ref.obj {
		if o.svcs[j].st == nil {
			return 0
		}
		return int(o.svcs[j].st.n)
	}
	e, _ := c.m.wanted(ref.obj, c.fams[i], o.in)
	return len(e)
}

// overBudget is the skip of a Service that wants n[i] entries in the i-th family (sum in all) when
// the Budget refuses it: the Services before it in its namespace have nsUsed, in the map total.
// nil: it gets in. The key and the skip are made only for a Service that is refused: admit runs
// over every Service at every change, and building them for all was 20,000 allocations (0.64 MB) a
// change at 10,000 Services (BenchmarkRulesOneNewService10k).
func overBudget(ref svcRef, fams []rules.Family, n, nsUsed []int, total, sum int, b Budget) *Skip {
	for i, f := range fams {
		if sk, ok := serviceBudgetSkip("", n[i], b.PerService); ok {
			sk.Object, sk.Detail = ref.obj.Key(), fmt.Sprintf("%s (%s)", sk.Detail, f)
			return new(sk)
		}
	}
	for i, f := range fams {
		if nsUsed[i]+n[i] > b.PerNamespace {
			return &Skip{Object: ref.obj.Key(), Reason: ReasonNamespaceBudget, Detail: fmt.Sprintf("the Service wants %d %s entries and the Services before it in namespace %s have %d of the %d one namespace may have in a family (fix.MaxEntriesPerNamespace, or half of fix.MaxEntriesPerFixAt the backend and memory limit); none of them is programmed, in any family", n[i], f, ref.obj.Namespace, nsUsed[i], b.PerNamespace)}
		}
	}
	if total+sum > b.PerMap {
		return &Skip{Object: ref.obj.Key(), Reason: ReasonFixBudget, Detail: fmt.Sprintf("the Service wants %d entries in all families and the fix has %d of the %d it may program in all families with its backend at the agent's memory limit (fix.MaxEntriesPerFixAt, config memoryLimit); none of them is programmed, in any family", sum, total, b.PerMap)}
	}
	return nil
}

// refusedSeed seeds the digests of refused Services (compared within the process only).
var refusedSeed = maphash.MakeSeed()

// walked is what changed between the previous Services of a map and the new ones.
type walked struct {
	next           []svcRef // the new Services' states, in order
	removed, added []*svcState
}

// walk goes through the previous Services (st.svcs) and services side by side; a Service whose
// object changed is removed and added again, and wanted gets the entries computed for the added.
// Services that were there before and still are, one after the other, are recognised by pointer
// alone: with 10,000 Services a change then compares names only around the Services that changed.
// It returns false, having changed nothing in st, when services is not sorted by namespace/name.
func (m *ServiceMap[In]) walk(st *serviceMapState[In], services []*Service, family rules.Family, in In, wanted map[*svcState][]rules.MapEntry) (walked, bool) {
	w := walked{next: st.spare[:0]}
	if cap(w.next) < len(services) {
		// Room for some more: a Service created at a time would otherwise need a new slice of
		// them all (160 KB at 10,000) in every call.
		w.next = make([]svcRef, 0, len(services)+len(services)/8)
	}
	i := 0
	kept := false // the previous element of services was st.svcs[i-1], kept
	for k, svc := range services {
		if kept && i < len(st.svcs) && st.svcs[i].obj == svc {
			// st.svcs[i-1] and st.svcs[i] are in order and distinct: nothing to compare.
			w.next = append(w.next, st.svcs[i])
			i++
			continue
		}
		kept = false
		if k > 0 {
			switch c := CompareServices(services[k-1], svc); {
			case c > 0:
				return w, false
			case c == 0:
				continue // a duplicate name: the first object counts
			}
		}
		for i < len(st.svcs) && CompareServices(st.svcs[i].obj, svc) < 0 {
			w.removed = appendState(w.removed, st.svcs[i])
			i++
		}
		if i < len(st.svcs) && CompareServices(st.svcs[i].obj, svc) == 0 {
			if st.svcs[i].obj == svc {
				w.next = append(w.next, st.svcs[i])
				i++
				kept = true
				continue
			}
			w.removed = appendState(w.removed, st.svcs[i])
			i++
		}
		s, entries := m.compute(svc, family, in)
		if s.st != nil {
			wanted[s.st] = entries
		}
		w.added = appendState(w.added, s)
		w.next = append(w.next, s)
	}
	for _, r := range st.svcs[i:] {
		w.removed = appendState(w.removed, r)
	}
	return w, true
}

// claim adds s to the Services that want k.
func (st *serviceMapState[In]) claim(k entryKey, s *svcState) {
	o := st.owner[k]
	if o == nil {
		st.owner[k] = s
		return
	}
	c := st.contested[k]
	if c == nil {
		c = []*svcState{o}
	}
	at, _ := slices.BinarySearchFunc(c, s, func(a, b *svcState) int { return CompareServices(a.obj, b.obj) })
	c = slices.Insert(c, at, s)
	st.contested[k], st.owner[k] = c, c[0]
}

// release removes s from the Services that want k.
func (st *serviceMapState[In]) release(k entryKey, s *svcState) {
	c, ok := st.contested[k]
	if !ok {
		if st.owner[k] == s {
			delete(st.owner, k)
		}
		return
	}
	c = slices.DeleteFunc(c, func(o *svcState) bool { return o == s })
	st.owner[k] = c[0]
	if len(c) == 1 {
		delete(st.contested, k)
	} else {
		st.contested[k] = c
	}
}

func appendState(list []*svcState, r svcRef) []*svcState {
	if r.st != nil {
		list = append(list, r.st)
	}
	return list
}

// unchanged says whether services are the same objects as last time.
func unchanged(prev []svcRef, services []*Service) bool {
	if len(prev) != len(services) {
		return false
	}
	for i, s := range prev {
		if s.obj != services[i] {
			return false
		}
	}
	return true
}

// compute makes svc's state and returns the entries it wants.
func (m *ServiceMap[In]) compute(svc *Service, family rules.Family, in In) (svcRef, []rules.MapEntry) {
	entries, skipped := m.wanted(svc, family, in)
	if len(entries) == 0 && len(skipped) == 0 {
		return svcRef{obj: svc}, nil
	}
	s := &svcState{obj: svc, skipped: skipped, n: int32(len(entries))}
	for i := range s.skipped {
		if s.skipped[i].Object == "" {
			s.skipped[i].Object = s.name()
		}
	}
	return svcRef{obj: svc, st: s}, entries
}

// wanted is the per-Service function's result with each key once (a Service wanting a key twice
// has it once, the first time).
func (m *ServiceMap[In]) wanted(svc *Service, family rules.Family, in In) ([]rules.MapEntry, []Skip) {
	entries, skipped := m.entries(svc, family, in)
	for i := range entries {
		if entryOf(entries[:i], keyOf(&entries[i])) == nil {
			continue
		}
		// A key twice (rare): a copy without the repeats. Without, the function's own slice is
		// kept: no copy per Service.
		out := make([]rules.MapEntry, 0, len(entries))
		for _, e := range entries {
			if entryOf(out, keyOf(&e)) == nil {
				out = append(out, e)
			}
		}
		return out, skipped
	}
	return entries, skipped
}

// entryOf returns the entry of k in entries.
func entryOf(entries []rules.MapEntry, k entryKey) *rules.MapEntry {
	for i := range entries {
		if keyOf(&entries[i]) == k {
			return &entries[i]
		}
	}
	return nil
}

// report walks the Services once; it allocates only for skips (and computes the entries of the
// Services that lost a conflict again, through entriesOf).
func (st *serviceMapState[In]) report(entriesOf func(*svcState) []rules.MapEntry) Report {
	var r Report
	for i := range st.result.Entries { // sorted by address first
		if i == 0 || st.result.Entries[i].Addr != st.result.Entries[i-1].Addr {
			r.Items++
		}
	}
	for _, ref := range st.svcs {
		s := ref.st
		if s == nil {
			continue
		}
		if s.wins > 0 {
			r.Covered++
		}
		r.Skipped = append(r.Skipped, s.skipped...)
		if s.over != nil {
			r.Skipped = append(r.Skipped, *s.over)
			continue
		}
		if s.wins == s.n {
			continue
		}
		entries := entriesOf(s)
		for i := range entries {
			e := &entries[i]
			if w := st.owner[keyOf(e)]; w != s {
				r.Skipped = append(r.Skipped, Skip{Object: s.name(), Reason: ReasonConflict,
					Detail: fmt.Sprintf("%s %s/%d is already used by %s", e.Addr, e.Protocol, e.Port, w.name())})
			}
		}
	}
	return r
}
