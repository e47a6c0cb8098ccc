package backend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// kernel is an Ops over an in-memory "kernel" with a generation that every commit moves, so the
// driver's decisions (read back or not, update or apply, stamp or not) can be counted.
type kernel struct {
	mu      sync.Mutex
	gen     uint32
	held    map[backend.Unit]int // what each unit holds: the ruleset's rule count
	calls   testkit.Counts
	lastPre backend.Prev[int]
	// block, when set, is called (without mu) at the start of every operation of the unit.
	block func(u backend.Unit)
	// stale makes the next Update fail with ErrStale; applyErr fails Apply.
	stale    bool
	applyErr error
	unsure   bool
	// refuse: objects (entry comments) whose entries Apply and Check refuse (ErrRejected).
	refuse map[string]bool
	// race, when set, is called (without mu) between a change and its read-back (Step.Finish).
	race func(u backend.Unit)
}

// finish is a Step.Finish that reads back what u holds and, like the real backends, refuses a
// read-back that is not the n rules just applied.
func (k *kernel) finish(u backend.Unit, n int) func(context.Context) (int, error) {
	return func(context.Context) (int, error) {
		if k.race != nil {
			k.race(u)
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		if got := k.held[u]; got != n {
			return got, fmt.Errorf("%w: %d rules, %d applied", backend.ErrInterfered, got, n)
		}
		return n, nil
	}
}

func newKernel() *kernel {
	return &kernel{held: map[backend.Unit]int{}, refuse: map[string]bool{}}
}

func (k *kernel) enter(op string, u backend.Unit) {
	if k.block != nil {
		k.block(u)
	}
	k.calls.Add(op)
}

func (k *kernel) generation() (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gen, nil
}

// foreign is someone else's commit.
func (k *kernel) foreign() { k.mu.Lock(); k.gen++; k.mu.Unlock() }

// tamper changes what u holds behind the driver's back (a commit).
func (k *kernel) tamper(u backend.Unit) { k.mu.Lock(); k.held[u] = -1; k.gen++; k.mu.Unlock() }

func (k *kernel) Matches(ctx context.Context, u backend.Unit, rec int) (bool, error) {
	k.enter("matches", u)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.held[u] == rec, nil
}

func (k *kernel) Name() string                                            { return "test" }
func (k *kernel) Render(rs *rules.Ruleset) (string, error)                { return rs.Fix, nil }
func (k *kernel) Begin(context.Context, backend.Unit, backend.Mode) error { return nil }
func (k *kernel) Cleanup(context.Context) error                           { return nil }

// Check refuses a ruleset with an entry whose comment is in k.refuse.
func (k *kernel) Check(_ context.Context, u backend.Unit, rs *rules.Ruleset) error {
	k.enter("check", u)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.refused(rs)
}

func (k *kernel) refused(rs *rules.Ruleset) error {
	for _, m := range rs.Maps {
		for _, e := range m.Entries {
			if k.refuse[e.Comment] {
				return fmt.Errorf("entry of %s: %w", e.Comment, backend.ErrRejected)
			}
		}
	}
	return nil
}

// Counters reports the record the driver hands it as counter "rec".
func (k *kernel) Counters(_ context.Context, _ backend.Unit, rec int, known bool) (map[string]backend.Counter, error) {
	if !known {
		return nil, nil
	}
	return map[string]backend.Counter{"rec": {Packets: uint64(rec)}}, nil
}

// record is the unit's record as the driver hands it to Counters.
func record(d *backend.Driver[int], u backend.Unit) (int, bool) {
	cs, _ := d.Counters(context.Background(), u.Fix, u.Family)
	c, ok := cs["rec"]
	return int(c.Packets), ok
}

func (k *kernel) Update(ctx context.Context, u backend.Unit, prev backend.Prev[int], c backend.Change) (backend.Step[int], error) {
	from, desired := c.From, c.To
	k.enter("update", u)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lastPre = prev
	if k.stale {
		k.stale = false
		return backend.Step[int]{}, backend.ErrStale
	}
	if len(from.Chains) != len(desired.Chains) {
		return backend.Step[int]{}, nil // not a change Update makes
	}
	if k.refused(desired) != nil {
		return backend.Step[int]{}, backend.ErrStale
	}
	n := desired.RuleCount()
	k.held[u] = n
	k.gen++
	return backend.Step[int]{Done: true, Applied: true, Commits: 1, Rec: n, Finish: k.finish(u, n)}, nil
}

func (k *kernel) Apply(ctx context.Context, u backend.Unit, prev backend.Prev[int], desired *rules.Ruleset) (backend.Step[int], error) {
	k.enter("apply", u)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lastPre = prev
	if k.applyErr != nil {
		return backend.Step[int]{ReadBack: true, Unsure: k.unsure}, k.applyErr
	}
	if err := k.refused(desired); err != nil {
		return backend.Step[int]{ReadBack: true}, err
	}
	k.held[u] = desired.RuleCount()
	k.gen++
	n := desired.RuleCount()
	return backend.Step[int]{Applied: true, ReadBack: true, Rec: n, Finish: k.finish(u, n)}, nil
}

func (k *kernel) Remove(ctx context.Context, u backend.Unit, prev backend.Prev[int]) (backend.Step[int], error) {
	k.enter("remove", u)
	k.mu.Lock()
	defer k.mu.Unlock()
	_, there := k.held[u]
	delete(k.held, u)
	if there {
		k.gen++
	}
	return backend.Step[int]{Applied: there, ReadBack: true}, nil
}

// take returns the operations run since the last take.
func (k *kernel) take() map[string]int { return k.calls.Take() }

func ruleset(fix string, rulesInFirst int, chains int) *rules.Ruleset {
	rs := &rules.Ruleset{Fix: fix, Family: rules.IPv4}
	for i := range chains {
		c := rules.Chain{Name: []string{"A", "B", "C"}[i], Type: rules.Filter}
		if i == 0 {
			c.Hook = rules.Input
			for range rulesInFirst {
				c.Rules = append(c.Rules, rules.Rule{Verdict: rules.Verdict{Kind: rules.Accept}})
			}
		}
		rs.Chains = append(rs.Chains, c)
	}
	return rs
}

func mustReconcile(t testing.TB, d *backend.Driver[int], rs *rules.Ruleset, mode backend.Mode) backend.Result {
	t.Helper()
	res, err := d.Reconcile(context.Background(), rs.Fix, rs.Family, rs, mode)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func equalCalls(got map[string]int, want ...string) bool {
	w := map[string]int{}
	for _, op := range want {
		w[op]++
	}
	if len(got) != len(w) {
		return false
	}
	for op, n := range w {
		if got[op] != n {
			return false
		}
	}
	return true
}

func TestDriverTrustVerifyAndStamps(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	a, b := ruleset("a", 1, 1), ruleset("b", 1, 1)
	for _, step := range []struct {
		name string
		do   func() backend.Result
		want []string
		res  backend.Result
	}{
		{"first Trust of a: nothing recorded, applied", func() backend.Result { return mustReconcile(t, d, a, backend.Trust) }, []string{"apply"}, backend.Result{Applied: true, ReadBack: true}},
		{"first Trust of b", func() backend.Result { return mustReconcile(t, d, b, backend.Trust) }, []string{"apply"}, backend.Result{Applied: true, ReadBack: true}},
		// b's apply moved the generation after a's stamp (an Apply says nothing of its commits).
		{"Verify of a after b's apply reads back", func() backend.Result { return mustReconcile(t, d, a, backend.Verify) }, []string{"matches"}, backend.Result{ReadBack: true}},
		{"Verify of a again: the generation proves it", func() backend.Result { return mustReconcile(t, d, a, backend.Verify) }, nil, backend.Result{}},
		{"Verify of b: stamped by its apply", func() backend.Result { return mustReconcile(t, d, b, backend.Verify) }, nil, backend.Result{}},
		{"an Update of a, one commit", func() backend.Result { return mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust) }, []string{"update"}, backend.Result{Applied: true}},
		// a's own commit alone moved the generation: b's stamp is carried over.
		{"Verify of b after a's update needs no read", func() backend.Result { return mustReconcile(t, d, b, backend.Verify) }, nil, backend.Result{}},
		{"Verify of a after its update needs no read", func() backend.Result { return mustReconcile(t, d, ruleset("a", 2, 1), backend.Verify) }, nil, backend.Result{}},
		{"Trust of an equal ruleset does nothing", func() backend.Result { return mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust) }, nil, backend.Result{}},
		{"a change Update does not make goes to Apply", func() backend.Result { return mustReconcile(t, d, ruleset("a", 2, 2), backend.Trust) }, []string{"update", "apply"}, backend.Result{Applied: true, ReadBack: true}},
	} {
		if res, calls := step.do(), k.take(); !reflect.DeepEqual(res, step.res) || !equalCalls(calls, step.want...) {
			t.Fatalf("%s: result %+v, want %+v; calls %v, want %v", step.name, res, step.res, calls, step.want)
		}
	}
	k.foreign()
	k.take()
	if res := mustReconcile(t, d, b, backend.Verify); !reflect.DeepEqual(res, backend.Result{ReadBack: true}) || !equalCalls(k.take(), "matches") {
		t.Fatalf("Verify after a foreign commit: %+v; want a read-back only", res)
	}
	k.tamper(backend.Unit{Fix: "b", Family: rules.IPv4})
	if res := mustReconcile(t, d, b, backend.Verify); !res.Repaired || !res.Applied || !equalCalls(k.take(), "matches", "apply") {
		t.Fatalf("Verify after tampering: %+v; want repaired by an apply", res)
	}
	if !k.lastPre.Known || k.lastPre.Trusted {
		t.Errorf("the repair's Apply got %+v; want the record known and not trusted", k.lastPre)
	}
}

// TestDriverUpdateExact: Update is told the record is exact only while the generation proves that
// nothing but our own commits changed the kernel since the record last matched it.
func TestDriverUpdateExact(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	n, chains := 1, 1
	update := func() backend.Prev[int] {
		t.Helper()
		n++
		if res := mustReconcile(t, d, ruleset("a", n, chains), backend.Trust); !res.Applied || !equalCalls(k.take(), "update") {
			t.Fatalf("change %d: %+v; want one Update", n, res)
		}
		return k.lastPre
	}
	mustReconcile(t, d, ruleset("a", n, 1), backend.Trust)
	k.take()
	for _, step := range []struct {
		name  string
		pre   func()
		exact bool
	}{
		{"after the apply that stamped the record", nil, true},
		{"after our own update alone moved the generation", nil, true},
		{"after a foreign commit", k.foreign, false},
		{"after an update that followed a foreign commit (never stamped)", nil, false},
		{"after a Verify found the record true", func() { mustReconcile(t, d, ruleset("a", n, 1), backend.Verify); k.take() }, true},
		{"after an update that needed an Apply (stamped: nothing committed while it read back)", func() {
			chains = 2
			mustReconcile(t, d, ruleset("a", n, chains), backend.Trust)
			k.take()
		}, true},
	} {
		if step.pre != nil {
			step.pre()
		}
		if prev := update(); prev.Exact != step.exact || !prev.Known || !prev.Trusted {
			t.Errorf("Update %s: got %+v, want Exact %v (known, trusted)", step.name, prev, step.exact)
		}
	}
}

func TestDriverStaleUpdateAndFailedApply(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	mustReconcile(t, d, ruleset("a", 1, 1), backend.Trust)
	k.stale = true
	k.take()
	if res := mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust); !res.Applied || !equalCalls(k.take(), "update", "apply") || k.lastPre.Trusted {
		t.Fatalf("a stale Update: %+v, Apply got %+v; want an untrusted Apply", res, k.lastPre)
	}
	// A failed Apply keeps a record it did not doubt: the equal ruleset is then a no-op.
	k.applyErr = errors.New("refused")
	if _, err := d.Reconcile(ctx, "a", rules.IPv4, ruleset("a", 3, 2), backend.Trust); err == nil {
		t.Fatal("Apply error not returned")
	}
	k.applyErr = nil
	k.take()
	if res := mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust); !reflect.DeepEqual(res, backend.Result{}) || len(k.take()) != 0 {
		t.Fatalf("after a failed Apply, the recorded ruleset: %+v; want nothing done", res)
	}
	// One that is Unsure drops it: the next reconcile reads the kernel.
	k.applyErr, k.unsure = errors.New("refused"), true
	if _, err := d.Reconcile(ctx, "a", rules.IPv4, ruleset("a", 3, 2), backend.Trust); err == nil {
		t.Fatal("Apply error not returned")
	}
	k.applyErr = nil
	k.take()
	if res := mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust); !res.Applied || !equalCalls(k.take(), "apply") || k.lastPre.Known {
		t.Fatalf("after an unsure failure: %+v (prev %+v); want an Apply without a record", res, k.lastPre)
	}
}

func TestDriverRemoveAndAbsence(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	mustReconcile(t, d, ruleset("a", 1, 1), backend.Trust)
	k.take()
	remove := func(mode backend.Mode) backend.Result {
		res, err := d.Reconcile(ctx, "a", rules.IPv4, nil, mode)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := remove(backend.Verify); !res.Applied || !equalCalls(k.take(), "remove") {
		t.Fatalf("remove: %+v", res)
	}
	if res := remove(backend.Trust); res.ReadBack || len(k.take()) != 0 {
		t.Fatal("Trust removal of a known absence touched the kernel")
	}
	if res := remove(backend.Verify); res.ReadBack || len(k.take()) != 0 {
		t.Fatal("Verify removal with the generation unchanged touched the kernel")
	}
	k.foreign()
	if res := remove(backend.Verify); !res.ReadBack || res.Applied || !equalCalls(k.take(), "remove") {
		t.Fatalf("Verify removal after a foreign commit: %+v; want a look", res)
	}
	if _, ok := record(d, backend.Unit{Fix: "a", Family: rules.IPv4}); ok {
		t.Error("a removed unit still has a record")
	}
}

// A unit blocked inside an operation holds only its own lock: another unit reconciles and the
// blocked unit's record is read meanwhile.
func TestDriverBlockedUnitDelaysNoOther(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	a := backend.Unit{Fix: "a", Family: rules.IPv4}
	mustReconcile(t, d, ruleset("a", 1, 1), backend.Trust)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	k.block = func(u backend.Unit) {
		if u == a {
			once.Do(func() { close(entered) })
			<-release
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Reconcile(context.Background(), "a", rules.IPv4, ruleset("a", 2, 1), backend.Trust)
		done <- err
	}()
	<-entered
	others := make(chan struct{})
	go func() {
		defer close(others)
		mustReconcile(t, d, ruleset("b", 1, 1), backend.Trust)
		mustReconcile(t, d, ruleset("b", 2, 1), backend.Verify)
		if n, ok := record(d, a); !ok || n != 1 {
			t.Errorf("record of the blocked unit: %d, %v; want its last one (1 rule)", n, ok)
		}
	}()
	select {
	case <-others:
	case <-time.After(10 * time.Second):
		t.Fatal("another unit waited for the blocked one")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := record(d, a); n != 2 {
		t.Errorf("record after the blocked change: %d rules, want 2", n)
	}
}

// TestDriverInterference: someone changes a unit's objects between our change and its read-back
// (the test's flush lands right after our restore). The read-back must not become the record, which
// later Verifies would find matching: the Driver applies once more; a second interference is an
// error and leaves no record.
func TestDriverInterference(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	u := backend.Unit{Fix: "a", Family: rules.IPv4}
	races := 0
	k.race = func(v backend.Unit) {
		if v == u && races > 0 {
			races--
			k.tamper(u)
		}
	}
	held := func() int { k.mu.Lock(); defer k.mu.Unlock(); return k.held[u] }

	races = 1
	if res := mustReconcile(t, d, ruleset("a", 1, 1), backend.Trust); !res.Repaired || !res.Applied || !equalCalls(k.take(), "apply", "apply") || held() != 1 {
		t.Fatalf("an apply interfered with once: %+v, kernel holds %d; want a second apply and 1 rule", res, held())
	}
	if res := mustReconcile(t, d, ruleset("a", 1, 1), backend.Verify); res.Repaired || len(k.take()) != 0 {
		t.Fatalf("Verify after the second apply: %+v; want the stamped record to hold", res)
	}

	races = 1
	if res := mustReconcile(t, d, ruleset("a", 2, 1), backend.Trust); !res.Repaired || !equalCalls(k.take(), "update", "apply") || held() != 2 {
		t.Fatalf("an update interfered with: %+v, kernel holds %d; want an apply after it and 2 rules", res, held())
	}
	if !k.lastPre.Known || k.lastPre.Trusted {
		t.Errorf("the Apply after an interfered update got %+v; want the record known and not trusted", k.lastPre)
	}

	races = 2
	_, err := d.Reconcile(context.Background(), "a", rules.IPv4, ruleset("a", 3, 2), backend.Trust)
	if !errors.Is(err, backend.ErrInterfered) || !equalCalls(k.take(), "update", "apply", "apply") {
		t.Fatalf("interfered with twice: %v; want ErrInterfered after two applies", err)
	}
	if _, ok := record(d, u); ok {
		t.Error("a record survived a second interference")
	}
	if res := mustReconcile(t, d, ruleset("a", 3, 2), backend.Trust); !res.Applied || !equalCalls(k.take(), "apply") || held() != 3 {
		t.Fatalf("the reconcile after: %+v, kernel holds %d; want an apply of 3 rules", res, held())
	}
}

// withEntries is ruleset(fix, 1, 1) with a map holding one entry per object.
func withEntries(fix string, objects ...string) *rules.Ruleset {
	rs := ruleset(fix, 1, 1)
	m := rules.Map{Name: "m"}
	for _, o := range objects {
		i := o[len(o)-1] // the address follows the object's name
		m.Entries = append(m.Entries, rules.MapEntry{Addr: netip.AddrFrom4([4]byte{192, 0, 2, i}), Protocol: rules.TCP, Port: 80,
			To: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, i}), 80), Comment: o})
	}
	rs.Maps = []rules.Map{m}
	return rs
}

// An Apply the kernel refuses for one object's entries: the Driver finds the object with Check
// alone (nothing applied meanwhile), applies the rest, and reports it while it is refused; a change
// from the record leaves it out without a search; a changed entry of it is tried again.
func TestDriverIsolatesRejectedObjects(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	objs := []string{"ns/a", "ns/b", "ns/c", "ns/d", "ns/e"}
	k.refuse["ns/d"] = true
	res := mustReconcile(t, d, withEntries("f", objs...), backend.Trust)
	calls := k.take()
	if !reflect.DeepEqual(res.Rejected, []backend.Rejection{{Object: "ns/d", Detail: "entry of ns/d: " + backend.ErrRejected.Error()}}) {
		t.Fatalf("rejected %+v; want ns/d", res.Rejected)
	}
	if calls["apply"] != 2 || calls["check"] == 0 {
		t.Fatalf("calls %v; want the refused apply, checks, and one apply of the rest", calls)
	}
	if n := k.held[backend.Unit{Fix: "f", Family: rules.IPv4}]; n != 1+4 {
		t.Fatalf("the kernel holds %d rules; want the chain's and 4 entries", n)
	}
	// Unchanged: nothing done, still reported.
	if res := mustReconcile(t, d, withEntries("f", objs...), backend.Trust); len(res.Rejected) != 1 || len(k.take()) != 0 {
		t.Fatalf("unchanged: %+v", res)
	}
	// Another object goes: an Update without ns/d, no search.
	res = mustReconcile(t, d, withEntries("f", "ns/a", "ns/b", "ns/d", "ns/e"), backend.Trust)
	if calls := k.take(); len(res.Rejected) != 1 || !equalCalls(calls, "update") {
		t.Fatalf("a change beside the refused object: %+v, calls %v; want one update", res, calls)
	}
	// Its entry changes (the address moves) and is taken now.
	delete(k.refuse, "ns/d")
	changed := withEntries("f", "ns/a", "ns/b", "ns/d", "ns/e")
	changed.Maps[0].Entries[2].Port = 8080
	if res := mustReconcile(t, d, changed, backend.Trust); len(res.Rejected) != 0 {
		t.Fatalf("the changed object: %+v", res)
	}
	// Refused even without any object: the unit's error, nothing isolated.
	k.take()
	k.applyErr = fmt.Errorf("chain: %w", backend.ErrRejected)
	if _, err := d.Reconcile(context.Background(), "g", rules.IPv4, withEntries("g", "ns/x"), backend.Trust); !errors.Is(err, backend.ErrRejected) {
		t.Fatalf("a refusal of the chains: %v", err)
	}
}

// A ruleset with the Revision the unit was last reconciled with is unchanged without a look at its
// content; one without a Revision is compared by content.
func TestDriverRevision(t *testing.T) {
	k := newKernel()
	d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
	rs := withEntries("f", "ns/a")
	rs.Revision = 7
	mustReconcile(t, d, rs, backend.Trust)
	k.take()
	same := withEntries("f", "ns/a", "ns/b") // different content, the same revision: trusted
	same.Revision = 7
	if res := mustReconcile(t, d, same, backend.Trust); res.Applied || len(k.take()) != 0 {
		t.Fatalf("the same revision: %+v; want nothing done", res)
	}
	same.Revision = 0
	if res := mustReconcile(t, d, same, backend.Trust); !res.Applied {
		t.Fatalf("no revision, other content: %+v; want it applied", res)
	}
	k.take()
	again := withEntries("f", "ns/a", "ns/b")
	if res := mustReconcile(t, d, again, backend.Trust); res.Applied || len(k.take()) != 0 {
		t.Fatalf("no revision, equal content: %+v; want nothing done", res)
	}
}

// BenchmarkDriverChange10k: what the Driver itself costs per reconcile of a unit with 10,000 map
// entries (over operations that do no I/O): an unchanged ruleset known by its Revision, one
// compared by content, and one entry changed (decided and handed to Update).
func BenchmarkDriverChange10k(b *testing.B) {
	objs := make([]string, 10000)
	for i := range objs {
		objs[i] = fmt.Sprintf("ns/svc-%05d", i)
	}
	build := func() *rules.Ruleset {
		rs := ruleset("f", 1, 1)
		m := rules.Map{Name: "m"}
		for i, o := range objs {
			a := netip.AddrFrom4([4]byte{198, 18, byte(i / 250), byte(i%250 + 1)})
			m.Entries = append(m.Entries, rules.MapEntry{Addr: a, Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(a, 80), Comment: o})
		}
		rs.Maps = []rules.Map{m}
		return rs
	}
	for _, bc := range []struct {
		name string
		next func(base *rules.Ruleset, i int) *rules.Ruleset
	}{
		{"unchanged-revision", func(base *rules.Ruleset, _ int) *rules.Ruleset { return base }},
		{"unchanged-content", func(base *rules.Ruleset, _ int) *rules.Ruleset {
			rs := base.Clone()
			rs.Revision = 0
			rs.Maps[0].Entries = slices.Clone(base.Maps[0].Entries)
			return rs
		}},
		{"one-entry", func(base *rules.Ruleset, i int) *rules.Ruleset {
			rs := base.Clone()
			rs.Revision = uint64(i + 2)
			rs.Maps[0].Entries = slices.Clone(base.Maps[0].Entries)
			rs.Maps[0].Entries[9999].Port = uint16(81 + i%2)
			return rs
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			k := newKernel()
			d := backend.New[int](k, k.generation, slog.New(slog.DiscardHandler))
			base := build()
			base.Revision = 1
			mustReconcile(b, d, base, backend.Trust)
			nexts := []*rules.Ruleset{bc.next(base, 0), bc.next(base, 1)}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				mustReconcile(b, d, nexts[i%2], backend.Trust)
			}
		})
	}
}
