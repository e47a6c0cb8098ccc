package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/nfgen"
)

// Unit is one (fix, family): what one Reconcile is about, and what the Driver keeps a record and a
// lock for.
type Unit struct {
	Fix    string
	Family rules.Family
}

func (u Unit) String() string { return u.Fix + " (" + string(u.Family) + ")" }

// Ops are what a backend supplies to the Driver: the few operations that touch its kernel objects.
// R is the backend's record of a unit: what its last successful change rendered and found in the
// kernel after. The Driver calls the operations of one unit one at a time (under the unit's lock),
// and those of different units at the same time: an Ops implementation guards whatever its units
// share (a built-in chain's positions, an interface cache) itself, and holds nothing across units
// while it waits for the kernel.
type Ops[R any] interface {
	// Matches reads the unit's objects back and reports whether they still are what rec recorded.
	// It changes nothing.
	Matches(ctx context.Context, u Unit, rec R) (bool, error)
	// Update changes the kernel from prev.Rec (made from the ruleset from), trusted without reading
	// the kernel first, to desired: the cheap way for a change of the kind it knows (map entries, the
	// contents of some chains). prev.Exact says the generation proves the kernel still is the record;
	// only then may Update send a change whose result depends on what it does not overwrite (rules
	// inserted at positions). It returns Step.Done false, having changed nothing, for a change of
	// another kind, and ErrStale, having changed nothing, when the kernel refused a change built from
	// the record (the record was wrong; the Driver then calls Apply).
	Update(ctx context.Context, u Unit, prev Prev[R], from, desired *rules.Ruleset) (Step[R], error)
	// Apply makes the kernel hold desired for the unit, whatever it holds now. prev is the last
	// record: Trusted when it is known to match the kernel (Apply may then build its change from it
	// without reading), Known when there is one at all (it names objects the unit made). On error
	// nothing was changed. Apply reads the kernel under ctx and changes it regardless of ctx.
	Apply(ctx context.Context, u Unit, prev Prev[R], desired *rules.Ruleset) (Step[R], error)
	// Remove deletes every object of the unit; prev.Rec names what the unit made (prev.Trusted is
	// never set: a removal always looks at the kernel). Removing what is not there is not an error.
	Remove(ctx context.Context, u Unit, prev Prev[R]) (Step[R], error)
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

// Driver is the reconcile logic every backend shares: per unit it keeps the record of the last
// change, the last ruleset reconciled, a known-absent stamp, and a lock, and it decides when the
// record is trusted, when the kernel is read back, and which operation makes the change.
//
// A unit blocked in the kernel holds only its own lock: reconciles of other units and reads of
// records (Record, for counters) go on.
//
// Generation stamps: on nf_tables every commit moves the namespace's generation. A record (or an
// absence) stamped with generation g is known to match the kernel while the generation is g, so a
// Verify that reads g again needs no listing. After our own commit alone moved the generation from
// g0 to g1 (Step.Commits says how far), every stamp at g0 moves to g1.
type Driver[R any] struct {
	ops Ops[R]
	gen nfgen.Func
	log *slog.Logger

	// mu guards units and every unitState's fields except run; never held while the kernel is used.
	mu    sync.Mutex
	units map[Unit]*unitState[R]
}

type unitState[R any] struct {
	run sync.Mutex // held through one reconcile of the unit

	rec   R
	known bool           // rec is set
	rs    *rules.Ruleset // the ruleset rec was made from (nil when removed)
	stamp nfgen.Stamp    // generation at which rec (or the absence) matched the kernel
	// absent: the unit is known to hold nothing (removed, or found empty).
	absent bool
}

// NewDriver returns a Driver over ops. gen reads the nf_tables generation (nil: none, Verify always
// reads back).
func NewDriver[R any](ops Ops[R], gen nfgen.Func, log *slog.Logger) *Driver[R] {
	if log == nil {
		log = slog.Default()
	}
	return &Driver[R]{ops: ops, gen: gen, log: log, units: map[Unit]*unitState[R]{}}
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

// Record returns the unit's record without waiting for a reconcile in progress: what the last
// finished one left. Counters use it.
func (d *Driver[R]) Record(u Unit) (R, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.units[u]; st != nil && st.known {
		return st.rec, true
	}
	var zero R
	return zero, false
}

// Forget drops the records and absences of the units match selects (nil: all), after the backend
// removed their objects some other way (cleanup).
func (d *Driver[R]) Forget(match func(Unit) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for u, st := range d.units {
		if match == nil || match(u) {
			var zero R
			st.rec, st.known, st.rs, st.stamp, st.absent = zero, false, nil, nfgen.Stamp{}, false
		}
	}
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

// set records what the unit holds now (known false: nothing trusted).
func (d *Driver[R]) set(st *unitState[R], rec R, known bool, rs *rules.Ruleset, stamp nfgen.Stamp) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !known {
		var zero R
		rec, rs, stamp = zero, nil, nfgen.Stamp{}
	}
	st.rec, st.known, st.rs, st.stamp, st.absent = rec, known, rs, stamp, false
}

// Reconcile implements Backend.Reconcile for the backend whose Ops d drives. It never wraps errors
// with the unit: the caller knows it.
func (d *Driver[R]) Reconcile(ctx context.Context, fix string, family rules.Family, desired *rules.Ruleset, mode Mode) (Result, error) {
	u := Unit{Fix: fix, Family: family}
	if desired != nil && (desired.Fix != fix || desired.Family != family) {
		return Result{}, fmt.Errorf("ruleset of %s/%s reconciled as %s", desired.Fix, desired.Family, u)
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
	rec    R
	known  bool
	rs     *rules.Ruleset
	stamp  nfgen.Stamp
	absent bool
}

func (d *Driver[R]) view(st *unitState[R]) view[R] {
	d.mu.Lock()
	defer d.mu.Unlock()
	return view[R]{st.rec, st.known, st.rs, st.stamp, st.absent}
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
			v.stamp = nfgen.At(g0, genOK)
			d.set(st, v.rec, true, v.rs, v.stamp)
		} else {
			res.Repaired = true // the engine logs and counts it
			trusted = false
		}
	}
	if trusted && v.rs != nil && v.rs.Equal(desired) {
		d.log.Debug("rules unchanged", "fix", u.Fix, "family", u.Family, "mode", mode)
		return res, nil
	}
	if trusted {
		// Update changes the kernel without reading it first: nothing to cancel.
		prev := Prev[R]{Rec: v.rec, Known: true, Trusted: true, Exact: v.stamp.Is(g0, genOK)}
		step, err := d.ops.Update(context.WithoutCancel(ctx), u, prev, v.rs, desired)
		switch {
		case errors.Is(err, ErrStale):
			d.log.Info("a change built from our record was refused; reading the kernel and applying in full", "fix", u.Fix, "family", u.Family)
			trusted = false
		case err != nil:
			d.drop(st)
			return res, err
		case step.Done:
			res.Applied, res.ReadBack = step.Applied, res.ReadBack || step.ReadBack
			err := d.finish(context.WithoutCancel(ctx), st, desired, step, g0, genOK, &v.stamp)
			if !errors.Is(err, ErrInterfered) {
				return res, err
			}
			d.interfered(u, err)
			res.Repaired, trusted = true, false
			v.rec, v.known = step.Rec, true // names the objects the update made
		}
	}
	return d.applyFull(ctx, u, st, desired, Prev[R]{Rec: v.rec, Known: v.known, Trusted: trusted}, g0, genOK, res)
}

// applyFull makes the change with Ops.Apply, and once more when its read-back shows that someone
// changed our objects right after it (ErrInterfered).
func (d *Driver[R]) applyFull(ctx context.Context, u Unit, st *unitState[R], desired *rules.Ruleset, prev Prev[R], g0 uint32, genOK bool, res Result) (Result, error) {
	for attempt := 1; ; attempt++ {
		step, err := d.ops.Apply(ctx, u, prev, desired)
		res.Applied, res.ReadBack = res.Applied || step.Applied, res.ReadBack || step.ReadBack
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
		err = d.finish(context.WithoutCancel(ctx), st, desired, step, g0, genOK, nil)
		if attempt > 1 || !errors.Is(err, ErrInterfered) {
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

// drop forgets the unit's record: the next reconcile reads the kernel.
func (d *Driver[R]) drop(st *unitState[R]) {
	var zero R
	d.set(st, zero, false, nil, nfgen.Stamp{})
}

func (d *Driver[R]) interfered(u Unit, err error) {
	d.log.Info("our rules changed right after we applied them; applying again", "fix", u.Fix, "family", u.Family, "err", err)
}

// finish records a successful step. An Update (prev: the stamp of the record it started from) that
// sent nothing keeps that stamp; one that did keeps a stamp when prev was at g0 and its own commits
// alone moved the generation. An Apply (prev nil) is stamped when nothing committed while its result
// was read back.
func (d *Driver[R]) finish(ctx context.Context, st *unitState[R], desired *rules.Ruleset, step Step[R], g0 uint32, genOK bool, prev *nfgen.Stamp) error {
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
	var stamp nfgen.Stamp
	switch {
	case update && !step.Applied:
		stamp = *prev // nothing was sent: the record's stamp holds
	case update:
		if ours && chained && ok2 && g2 == g1 {
			stamp = nfgen.At(g1, true)
		}
	case ok1 && ok2 && g1 == g2:
		stamp = nfgen.At(g2, true)
	}
	d.set(st, rec, true, desired.Clone(), stamp)
	return nil
}

func (d *Driver[R]) remove(ctx context.Context, u Unit, st *unitState[R], mode Mode) (Result, error) {
	var res Result
	v := d.view(st)
	g0, genOK := d.generation()
	if v.absent && (mode == Trust || v.stamp.Is(g0, genOK)) {
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
	var zero R
	st.rec, st.known, st.rs, st.stamp, st.absent = zero, false, nil, nfgen.At(g1, ok1), true
	return res, nil
}
