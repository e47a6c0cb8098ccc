package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Unit is one (fix, family): what one Reconcile is about, and what the Driver keeps a record and a
// lock for.
type Unit struct {
	Fix    string
	Family rules.Family
}

func (u Unit) String() string { return u.Fix + " (" + string(u.Family) + ")" }

// Ops are what a backend supplies: the few operations that touch its kernel objects. New turns
// them into a Backend (the Driver); a backend implements nothing else of Backend.
//
// R is the backend's record of a unit: what its last successful change rendered and found in the
// kernel after. The Driver calls the operations of one unit one at a time (under the unit's lock),
// and those of different units at the same time: an Ops implementation guards whatever its units
// share (a built-in chain's positions, an interface cache) itself, and holds nothing across units
// while it waits for the kernel.
type Ops[R any] interface {
	// Name is the backend's name (Backend.Name).
	Name() string
	// Render is Backend.Render: the exact input that makes an empty kernel hold rs, touching nothing.
	Render(rs *rules.Ruleset) (string, error)
	// Begin is called at the start of every Reconcile of u, before anything else: an error (a fix id
	// the backend cannot name its objects after) fails the Reconcile with nothing done.
	Begin(ctx context.Context, u Unit, mode Mode) error
	// Matches reads the unit's objects back and reports whether they still are what rec recorded.
	// It changes nothing.
	Matches(ctx context.Context, u Unit, rec R) (bool, error)
	// Update changes the kernel from prev.Rec (made from c.From), trusted without reading the kernel
	// first, to c.To: the cheap way for a change of the kind it knows. c says what changed (the
	// Driver decides that, once): c.Chains false means only the entries of the maps c.Maps differ.
	// prev.Exact says the generation proves the kernel still is the record; only then may Update
	// send a change whose result depends on what it does not overwrite (rules inserted at
	// positions). It returns Step.Done false, having changed nothing, for a change of another kind,
	// and ErrStale, having changed nothing, when the kernel refused a change built from the record
	// (the record was wrong, or the new content was refused; the Driver then calls Apply).
	Update(ctx context.Context, u Unit, prev Prev[R], c Change) (Step[R], error)
	// Apply makes the kernel hold desired for the unit, whatever it holds now. prev is the last
	// record: Trusted when it is known to match the kernel (Apply may then build its change from it
	// without reading), Known when there is one at all (it names objects the unit made). On error
	// nothing was changed; an error wrapping ErrRejected says the kernel (or its tool) refused the
	// content, and the Driver then looks for the objects it comes from (Check). Apply reads the
	// kernel under ctx and changes it regardless of ctx.
	Apply(ctx context.Context, u Unit, prev Prev[R], desired *rules.Ruleset) (Step[R], error)
	// Check asks the kernel (or its tool) whether it would take desired for the unit, changing
	// nothing (iptables-restore --test, nft --check). A refusal of the content wraps ErrRejected;
	// any other error (the tool cannot run) ends the search for rejected objects.
	Check(ctx context.Context, u Unit, desired *rules.Ruleset) error
	// Remove deletes every object of the unit; prev.Rec names what the unit made (prev.Trusted is
	// never set: a removal always looks at the kernel). Removing what is not there is not an error.
	Remove(ctx context.Context, u Unit, prev Prev[R]) (Step[R], error)
	// Counters reads the unit's named counters (Rule.Counter). rec is the last finished change's
	// record (known false: none); Counters never waits for a reconcile.
	Counters(ctx context.Context, u Unit, rec R, known bool) (map[string]Counter, error)
	// Cleanup removes every object the backend owns in every family, whatever unit made it.
	Cleanup(ctx context.Context) error
}

// Change is what the Driver hands Ops.Update: the ruleset the record was made from, the one wanted,
// and what differs between them.
type Change struct {
	From, To *rules.Ruleset
	// Chains: something besides map entries differs (chains, rules, the set of maps).
	Chains bool
	// Maps: when Chains is false, the indexes of the maps whose entries differ.
	Maps []int
}

// None says the change is empty.
func (c Change) None() bool { return !c.Chains && len(c.Maps) == 0 }

// diff is the one place that decides what changed between two rulesets of a unit.
func diff(from, to *rules.Ruleset) Change {
	c := Change{From: from, To: to}
	if !from.SameExceptEntries(to) {
		c.Chains = true
		return c
	}
	for i := range to.Maps {
		if !slices.Equal(from.Maps[i].Entries, to.Maps[i].Entries) {
			c.Maps = append(c.Maps, i)
		}
	}
	return c
}

// Prev is the record a Driver hands to Update, Apply and Remove.
type Prev[R any] struct {
	Rec     R
	Known   bool
	Trusted bool
	// Exact: the nf_tables generation has not moved since Rec was last found to match the kernel
	// (or since our own commit that Rec records), so nothing else has changed the kernel meanwhile.
	Exact bool
}

// Step says what one operation did.
type Step[R any] struct {
	// Done: Update made the change (false: not a change it makes; nothing was changed).
	Done bool
	// Applied: the kernel was changed.
	Applied bool
	// ReadBack: the unit's objects (or the kernel's whole ruleset) were listed.
	ReadBack bool
	// Commits is how many nf_tables commits the change made, all with a real change (each moves the
	// generation by one), or 0 when it cannot say. The Driver uses it to carry the other units'
	// stamps over the generation step that this commit alone made.
	Commits int
	// Unsure, with an error: the kernel may no longer be what the record says (the record is dropped
	// and the next reconcile reads the kernel). Without it a failed change keeps the record.
	Unsure bool
	// Rec is the new record.
	Rec R
	// Finish, when set, completes Rec by reading the kernel back after the change. The Driver reads
	// the generation around it, so that the record is stamped only if nothing else committed while
	// it was read.
	Finish func(ctx context.Context) (R, error)
}

// ErrStale is returned by Ops.Update when the kernel refused a change built from the record.
var ErrStale = errors.New("the kernel refused a change built from the record")

// ErrInterfered is returned (wrapped, naming the difference) by a Step's Finish when the read-back
// does not hold what the change just made: someone else changed the unit's objects between our
// commit and the read-back (a flush, a deleted jump). Such a read-back must not become the record,
// which Verify would then find matching: the Driver drops the record and applies once more.
var ErrInterfered = errors.New("our objects changed between the change and its read-back")

// ErrRejected is wrapped by Ops.Apply and Ops.Check errors when the kernel or its tool refused the
// content of a ruleset (iptables-restore or nft naming an input line), as opposed to failing to run.
var ErrRejected = errors.New("the kernel refused the rules")

// ReasonRejected is the skip reason (fix.Skip.Reason, nnm_fix_objects_skipped) of an object whose
// rules the kernel refused: the rest of its unit is programmed without them.
const ReasonRejected = "rejected-by-kernel"

// Rejection is an object (a map entry's Comment: a Service's namespace/name) whose rules the kernel
// refused, and why.
type Rejection struct {
	Object string
	Detail string
}

// Driver is the Backend every backend is: over a backend's Ops it keeps, per unit, the record of
// the last change, the ruleset asked for and the one applied, the revision they carry, whether the
// unit is known to hold nothing, the objects the kernel refused, and a lock; it decides what
// changed, when the record is trusted, when the kernel is read back, and which operation makes the
// change.
//
// A unit blocked in the kernel holds only its own lock: reconciles of other units and reads of
// records (Counters) go on.
//
// Generation stamps: on nf_tables every commit moves the namespace's generation. A record (or an
// absence) stamped with generation g is known to match the kernel while the generation is g, so a
// Verify that reads g again needs no listing. After our own commit alone moved the generation from
// g0 to g1 (Step.Commits says how far), every stamp at g0 moves to g1.
//
// Rejected objects: when the kernel refuses an Apply's content (ErrRejected), the Driver finds the
// objects the refused rules come from by asking Ops.Check about the ruleset without halves of them
// (nothing is changed while it searches), applies the rest, and reports them in Result.Rejected:
// changes made from the record leave them out while their entries stay the same; a full apply (a
// repair, a dropped record) tries them again.
type Driver[R any] struct {
	ops Ops[R]
	gen Generation
	log *slog.Logger

	// mu guards units and every unitState's fields except run; never held while the kernel is used.
	mu    sync.Mutex
	units map[Unit]*unitState[R]
}

var _ Backend = (*Driver[int])(nil)

type unitState[R any] struct {
	run sync.Mutex // held through one reconcile of the unit

	rec   R
	known bool // rec is set
	// asked is the ruleset last reconciled (nil when removed), rev its Revision; applied is what was
	// put in the kernel for it (asked without the rejected objects' entries).
	asked, applied *rules.Ruleset
	rev            uint64
	rejected       []rejected
	stamp          stamp // generation at which rec (or the absence) matched the kernel
	// absent: the unit is known to hold nothing (removed, or found empty). The one place that
	// knows it: the engine asks again (Trust) instead of keeping its own mark.
	absent bool
}

// rejected is a Rejection with the entries it was refused for: it stays rejected while they are
// the same.
type rejected struct {
	Rejection
	entries []rules.MapEntry
}

// New returns the Backend that drives ops. gen reads the nf_tables generation (nil: none, Verify
// always reads back).
func New[R any](ops Ops[R], gen Generation, log *slog.Logger) *Driver[R] {
	if log == nil {
		log = slog.Default()
	}
	return &Driver[R]{ops: ops, gen: gen, log: log, units: map[Unit]*unitState[R]{}}
}

// Name is the backend's name.
func (d *Driver[R]) Name() string { return d.ops.Name() }

// Render is the backend's rendering of rs.
func (d *Driver[R]) Render(rs *rules.Ruleset) (string, error) { return d.ops.Render(rs) }

// Counters reads the unit's counters with the record of the last finished change, never waiting
// for a reconcile in progress.
func (d *Driver[R]) Counters(ctx context.Context, fix string, family rules.Family) (map[string]Counter, error) {
	u := Unit{Fix: fix, Family: family}
	rec, known := d.record(u)
	return d.ops.Counters(ctx, u, rec, known)
}

// Cleanup removes everything the backend owns and forgets every record.
func (d *Driver[R]) Cleanup(ctx context.Context) error {
	defer d.Forget(nil)
	return d.ops.Cleanup(ctx)
}

// opsValue is the backend's Ops, for As.
func (d *Driver[R]) opsValue() any { return d.ops }

// As returns be as a T, or the Ops under it when be is a Driver: how a caller reaches what one
// backend offers beyond Backend (CleanupPlanner, the iptables backend's predecessor takeover).
func As[T any](be Backend) (T, bool) {
	if t, ok := any(be).(T); ok {
		return t, true
	}
	if x, ok := be.(interface{ opsValue() any }); ok {
		t, ok := x.opsValue().(T)
		return t, ok
	}
	var zero T
	return zero, false
}

func (d *Driver[R]) unit(u Unit) *unitState[R] {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.units[u]
	if st == nil {
		st = &unitState[R]{}
		d.units[u] = st
	}
	return st
}

// record returns the unit's record without waiting for a reconcile in progress.
func (d *Driver[R]) record(u Unit) (R, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.units[u]; st != nil && st.known {
		return st.rec, true
	}
	var zero R
	return zero, false
}

// Forget drops the records and absences of the units match selects (nil: all), after their objects
// were removed some other way (cleanup).
func (d *Driver[R]) Forget(match func(Unit) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for u, st := range d.units {
		if match == nil || match(u) {
			st.reset()
		}
	}
}

func (st *unitState[R]) reset() {
	var zero R
	st.rec, st.known, st.asked, st.applied, st.rev, st.rejected, st.stamp, st.absent = zero, false, nil, nil, 0, nil, stamp{}, false
}

func (d *Driver[R]) generation() (uint32, bool) { return d.gen.Read(d.log) }

// promote moves every stamp at g0 to g1 after only our own commits moved the generation.
func (d *Driver[R]) promote(g0, g1 uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, st := range d.units {
		st.stamp = st.stamp.Promoted(g0, g1)
	}
}

// outcome is what a successful change leaves: the ruleset asked for, the one applied and the
// objects left out.
type outcome struct {
	asked, applied *rules.Ruleset
	rejected       []rejected
}

// set records what the unit holds now.
func (d *Driver[R]) set(st *unitState[R], rec R, o outcome, stamp stamp) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st.rec, st.known, st.asked, st.applied, st.rejected, st.stamp, st.absent = rec, true, o.asked, o.applied, o.rejected, stamp, false
	st.rev = o.asked.Revision
}

// Reconcile implements Backend.Reconcile for the backend whose Ops d drives. It never wraps errors
// with the unit: the caller knows it.
func (d *Driver[R]) Reconcile(ctx context.Context, fix string, family rules.Family, desired *rules.Ruleset, mode Mode) (Result, error) {
	u := Unit{Fix: fix, Family: family}
	if desired != nil && (desired.Fix != fix || desired.Family != family) {
		return Result{}, fmt.Errorf("ruleset of %s/%s reconciled as %s", desired.Fix, desired.Family, u)
	}
	if err := d.ops.Begin(ctx, u, mode); err != nil {
		return Result{}, err
	}
	st := d.unit(u)
	st.run.Lock()
	defer st.run.Unlock()
	if desired == nil {
		return d.remove(ctx, u, st, mode)
	}
	return d.apply(ctx, u, st, desired, mode)
}

// view is a consistent copy of a unitState's fields.
type view[R any] struct {
	rec            R
	known          bool
	asked, applied *rules.Ruleset
	rev            uint64
	rejected       []rejected
	stamp          stamp
	absent         bool
}

func (d *Driver[R]) view(st *unitState[R]) view[R] {
	d.mu.Lock()
	defer d.mu.Unlock()
	return view[R]{st.rec, st.known, st.asked, st.applied, st.rev, st.rejected, st.stamp, st.absent}
}

// same says whether desired is what the unit was last reconciled with by its revision, without a
// look at its content (without one, apply compares the content: diff).
func (v *view[R]) same(desired *rules.Ruleset) bool {
	return v.asked != nil && desired.Revision != 0 && desired.Revision == v.rev
}

func rejections(rs []rejected) []Rejection {
	if len(rs) == 0 {
		return nil
	}
	out := make([]Rejection, len(rs))
	for i, r := range rs {
		out[i] = r.Rejection
	}
	return out
}

func (d *Driver[R]) apply(ctx context.Context, u Unit, st *unitState[R], desired *rules.Ruleset, mode Mode) (Result, error) {
	var res Result
	v := d.view(st)
	g0, genOK := d.generation()
	trusted := v.known
	if trusted && mode == Verify && !v.stamp.Is(g0, genOK) {
		res.ReadBack = true
		ok, err := d.ops.Matches(ctx, u, v.rec)
		if err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, err
		}
		if ok {
			v.stamp = stampAt(g0, genOK)
			d.set(st, v.rec, outcome{v.asked, v.applied, v.rejected}, v.stamp)
		} else {
			res.Repaired = true // the engine logs and counts it
			trusted = false
		}
	}
	if trusted && v.same(desired) {
		d.log.Debug("rules unchanged", "fix", u.Fix, "family", u.Family, "mode", mode)
		res.Rejected = rejections(v.rejected)
		return res, nil
	}
	// Objects the kernel refused stay out of changes built from the record while their entries
	// are what was refused.
	o := outcome{asked: desired, applied: desired}
	if len(v.rejected) > 0 {
		o.applied, o.rejected = carry(desired, v.rejected)
	}
	if trusted {
		c := diff(v.applied, o.applied)
		if c.None() {
			// Equal by content: recorded with desired's revision, which the next pass knows.
			d.log.Debug("rules unchanged", "fix", u.Fix, "family", u.Family, "mode", mode)
			d.set(st, v.rec, o.cloned(), v.stamp)
			res.Rejected = rejections(o.rejected)
			return res, nil
		}
		// Update changes the kernel without reading it first: nothing to cancel.
		prev := Prev[R]{Rec: v.rec, Known: true, Trusted: true, Exact: v.stamp.Is(g0, genOK)}
		step, err := d.ops.Update(context.WithoutCancel(ctx), u, prev, c)
		switch {
		case errors.Is(err, ErrStale):
			d.log.Info("a change built from our record was refused; reading the kernel and applying in full", "fix", u.Fix, "family", u.Family)
			trusted = false
		case err != nil:
			d.drop(st)
			return res, err
		case step.Done:
			res.Applied, res.ReadBack = step.Applied, res.ReadBack || step.ReadBack
			err := d.finish(context.WithoutCancel(ctx), st, o, step, g0, genOK, &v.stamp)
			if !errors.Is(err, ErrInterfered) {
				res.Rejected = rejections(o.rejected)
				return res, err
			}
			d.interfered(u, err)
			res.Repaired, trusted = true, false
			v.rec, v.known = step.Rec, true // names the objects the update made
		}
	}
	if !trusted {
		// A full apply tries every object again: what the kernel refused may be taken now.
		o = outcome{asked: desired, applied: desired}
	}
	return d.applyFull(ctx, u, st, o, Prev[R]{Rec: v.rec, Known: v.known, Trusted: trusted}, g0, genOK, res)
}

// applyFull makes the change with Ops.Apply, and once more when its read-back shows that someone
// changed our objects right after it (ErrInterfered). When the kernel refuses the content
// (ErrRejected), it leaves out the objects it finds refused (isolate) and applies the rest.
func (d *Driver[R]) applyFull(ctx context.Context, u Unit, st *unitState[R], o outcome, prev Prev[R], g0 uint32, genOK bool, res Result) (Result, error) {
	isolated := false
	for attempt := 1; ; attempt++ {
		step, err := d.ops.Apply(ctx, u, prev, o.applied)
		res.Applied, res.ReadBack = res.Applied || step.Applied, res.ReadBack || step.ReadBack
		if err != nil && !isolated && !step.Applied && errors.Is(err, ErrRejected) && ctx.Err() == nil {
			isolated = true
			kept, more, ierr := d.isolate(ctx, u, o.applied, err)
			if ierr == nil {
				// The failed Apply changed nothing: the record, if trusted, still holds unless the
				// operation is not sure.
				prev.Trusted = prev.Trusted && !step.Unsure
				o.applied, o.rejected = kept, append(slices.Clone(o.rejected), more...)
				for _, r := range more {
					d.log.Warn("the kernel refused an object's rules; programming the rest without them", "fix", u.Fix, "family", u.Family, "object", r.Object, "err", r.Detail)
				}
				attempt--
				continue
			}
			err = ierr
		}
		if err != nil {
			if ctx.Err() != nil && !step.Applied {
				if res.Repaired {
					d.drop(st) // the record was found wrong
				}
				return res, ctx.Err() // cancelled while reading: nothing changed
			}
			// The change is atomic: the kernel holds what it held, which the record describes unless
			// it was found changed or the operation is not sure (Step.Unsure).
			if res.Repaired || step.Unsure {
				d.drop(st)
			}
			return res, err
		}
		err = d.finish(context.WithoutCancel(ctx), st, o, step, g0, genOK, nil)
		if attempt > 1 || !errors.Is(err, ErrInterfered) {
			if err == nil {
				res.Rejected = rejections(o.rejected)
			}
			return res, err
		}
		// Once more, from a listing: someone changed our objects right after we did. A second
		// interference is returned (the record stays dropped; the next reconcile reads the kernel).
		d.interfered(u, err)
		res.Repaired = true
		prev = Prev[R]{Rec: step.Rec, Known: true}
		g0, genOK = d.generation()
	}
}

// objects lists the distinct objects that rs's map entries come from (their Comment), sorted.
// Entries without one belong to no object and are never left out.
func objects(rs *rules.Ruleset) []string {
	seen := map[string]bool{}
	for _, m := range rs.Maps {
		for _, e := range m.Entries {
			if e.Comment != "" {
				seen[e.Comment] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for o := range seen {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

// without is rs without the map entries of the objects drop names (rs itself when it has none).
func without(rs *rules.Ruleset, drop func(string) bool) *rules.Ruleset {
	out := *rs
	out.Maps = slices.Clone(rs.Maps)
	for i := range out.Maps {
		var kept []rules.MapEntry
		for j, e := range rs.Maps[i].Entries {
			if e.Comment != "" && drop(e.Comment) {
				if kept == nil {
					kept = slices.Clone(rs.Maps[i].Entries[:j])
				}
				continue
			}
			if kept != nil {
				kept = append(kept, e)
			}
		}
		if kept != nil {
			out.Maps[i].Entries = kept
		}
	}
	return &out
}

// entriesOf are the entries of object in rs, map by map, each map's followed by a marker that no
// entry equals (no address), so that an entry moving to another map is a change.
func entriesOf(rs *rules.Ruleset, object string) []rules.MapEntry {
	var out []rules.MapEntry
	for i, m := range rs.Maps {
		for _, e := range m.Entries {
			if e.Comment == object {
				out = append(out, e)
			}
		}
		out = append(out, rules.MapEntry{Port: uint16(i)})
	}
	return out
}

// carry leaves out of desired the objects refused before whose entries did not change.
func carry(desired *rules.Ruleset, prev []rejected) (*rules.Ruleset, []rejected) {
	var keep []rejected
	drop := map[string]bool{}
	for _, r := range prev {
		if slices.Equal(entriesOf(desired, r.Object), r.entries) {
			keep = append(keep, r)
			drop[r.Object] = true
		}
	}
	if len(keep) == 0 {
		return desired, nil
	}
	return without(desired, func(o string) bool { return drop[o] }), keep
}

// isolate finds the objects of rs whose entries the kernel refuses (cause: the refusal of rs),
// asking Ops.Check only, so that nothing changes while it searches: halves of the objects are added
// to those known good until a single refused one is left. It returns rs without them, or cause
// when the kernel refuses rs even without any object's entries (the fault is not an object's).
func (d *Driver[R]) isolate(ctx context.Context, u Unit, rs *rules.Ruleset, cause error) (*rules.Ruleset, []rejected, error) {
	objs := objects(rs)
	if len(objs) == 0 {
		return nil, nil, cause
	}
	good := map[string]bool{}
	// check asks whether rs with the entries of the good objects and of try (and none else) is taken.
	check := func(try []string) error {
		in := map[string]bool{}
		for _, o := range try {
			in[o] = true
		}
		return d.ops.Check(ctx, u, without(rs, func(o string) bool { return !good[o] && !in[o] }))
	}
	if err := check(nil); err != nil {
		if errors.Is(err, ErrRejected) {
			return nil, nil, cause // refused without any object: not an object's fault
		}
		return nil, nil, err
	}
	// The tools name the line they refused, and our lines carry the object's name (a rule's or an
	// element's comment): when the rest is taken without the objects the message names, only
	// those are searched.
	suspects := objs
	if named := namedIn(cause.Error(), objs); len(named) > 0 && len(named) < len(objs) {
		isNamed := map[string]bool{}
		for _, o := range named {
			isNamed[o] = true
		}
		var rest []string
		for _, o := range objs {
			if !isNamed[o] {
				rest = append(rest, o)
			}
		}
		switch err := check(rest); {
		case err == nil:
			for _, o := range rest {
				good[o] = true
			}
			suspects = named
		case !errors.Is(err, ErrRejected):
			return nil, nil, err
		}
	}
	var bad []rejected
	var search func(s []string) error
	search = func(s []string) error {
		err := check(s)
		switch {
		case err == nil:
			for _, o := range s {
				good[o] = true
			}
			return nil
		case !errors.Is(err, ErrRejected):
			return err
		case len(s) == 1:
			bad = append(bad, rejected{Rejection: Rejection{Object: s[0], Detail: err.Error()}, entries: entriesOf(rs, s[0])})
			return nil
		}
		if err := search(s[:len(s)/2]); err != nil {
			return err
		}
		return search(s[len(s)/2:])
	}
	if err := search(suspects); err != nil {
		return nil, nil, fmt.Errorf("%w (looking for the objects the kernel refused: %v)", cause, err)
	}
	if len(bad) == 0 {
		return nil, nil, cause // taken as a whole now: let the next attempt apply it
	}
	slices.SortFunc(bad, func(a, b rejected) int { return cmp.Compare(a.Object, b.Object) })
	return without(rs, func(o string) bool { return !good[o] }), bad, nil
}

// namedIn lists the objects whose names msg contains (at most a few: a message names a line).
func namedIn(msg string, objs []string) []string {
	var out []string
	for _, o := range objs {
		if strings.Contains(msg, o) {
			if out = append(out, o); len(out) > 8 {
				return nil
			}
		}
	}
	return out
}

// drop forgets the unit's record: the next reconcile reads the kernel.
func (d *Driver[R]) drop(st *unitState[R]) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st.reset()
}

func (d *Driver[R]) interfered(u Unit, err error) {
	d.log.Info("our rules changed right after we applied them; applying again", "fix", u.Fix, "family", u.Family, "err", err)
}

// finish records a successful step. An Update (prev: the stamp of the record it started from) that
// sent nothing keeps that stamp; one that did keeps a stamp when prev was at g0 and its own commits
// alone moved the generation. An Apply (prev nil) is stamped when nothing committed while its result
// was read back.
func (d *Driver[R]) finish(ctx context.Context, st *unitState[R], o outcome, step Step[R], g0 uint32, genOK bool, prev *stamp) error {
	update := prev != nil
	chained := update && prev.Is(g0, genOK)
	g1, ok1 := d.generation()
	ours := genOK && ok1 && step.Commits > 0 && g1 == g0+uint32(step.Commits)
	if ours {
		d.promote(g0, g1)
	}
	rec := step.Rec
	if step.Finish != nil {
		var err error
		if rec, err = step.Finish(ctx); err != nil {
			d.drop(st)
			return err
		}
	}
	g2, ok2 := g1, ok1
	if step.Finish != nil {
		g2, ok2 = d.generation()
	}
	var stamp stamp
	switch {
	case update && !step.Applied:
		stamp = *prev // nothing was sent: the record's stamp holds
	case update:
		if ours && chained && ok2 && g2 == g1 {
			stamp = stampAt(g1, true)
		}
	case ok1 && ok2 && g1 == g2:
		stamp = stampAt(g2, true)
	}
	d.set(st, rec, o.cloned(), stamp)
	return nil
}

// cloned is o with copies of its rulesets that the caller cannot change (their map entries aside:
// see Backend.Reconcile).
func (o outcome) cloned() outcome {
	applied := o.applied.Clone()
	asked := applied
	if o.asked != o.applied {
		asked = o.asked.Clone()
	}
	return outcome{asked, applied, o.rejected}
}

func (d *Driver[R]) remove(ctx context.Context, u Unit, st *unitState[R], mode Mode) (Result, error) {
	var res Result
	v := d.view(st)
	g0, genOK := d.generation()
	if v.absent && (mode == Trust || v.stamp.Is(g0, genOK)) {
		res.Absent = true
		return res, nil
	}
	step, err := d.ops.Remove(ctx, u, Prev[R]{Rec: v.rec, Known: v.known})
	res.Applied, res.ReadBack = step.Applied, step.ReadBack
	if err != nil {
		if ctx.Err() != nil && !step.Applied {
			return res, ctx.Err()
		}
		d.drop(st)
		return res, err
	}
	g1, ok1 := d.generation()
	d.mu.Lock()
	defer d.mu.Unlock()
	st.reset()
	st.stamp, st.absent = stampAt(g1, ok1), true
	res.Absent = true
	return res, nil
}
