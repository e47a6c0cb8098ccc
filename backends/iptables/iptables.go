// Package iptables is the iptables backend: it programs the NNM- chains of each fix with one
// iptables-restore --noflush transaction per (fix, family), for IPv4 and IPv6 through one code path.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/backends/nfgen"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Variant selects the iptables binaries: iptables-nft-* or iptables-legacy-*. Never mix them on a node.
type Variant string

const (
	NFT    Variant = "nft"
	Legacy Variant = "legacy"
)

// Options configure the backend.
type Options struct {
	// Variant is "nft" or "legacy".
	Variant Variant
	// LockWait is how many seconds iptables-restore waits for the xtables lock (-w); 0 means 5.
	LockWait int
	// Runner executes the binaries; nil means ExecRunner.
	Runner Runner
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Generation reads the nf_tables generation (package nfgen). Nil means nfgen.Get for the nft
	// variant run by ExecRunner (the process's own namespace), and none otherwise: Verify then always
	// runs iptables-save. Legacy iptables is not nf_tables and never uses it.
	Generation nfgen.Func
}

// Backend implements backend.Backend with iptables-restore/iptables-save.
type Backend struct {
	variant  Variant
	lockWait int
	run      Runner
	log      *slog.Logger

	gen nfgen.Func

	// mu serialises every kernel operation of this process and guards applied and absent.
	mu sync.Mutex
	// amu also guards applied: it is written with mu and amu held and read with either, so that
	// Counters (a scrape) never waits for an iptables-restore that waits for the xtables lock.
	amu     sync.Mutex
	applied map[key]*record
	// absent: (fix, family) known to hold nothing, with the generation of that knowledge.
	absent map[key]nfgen.Stamp
}

var _ backend.Backend = (*Backend)(nil)

type key struct {
	fix    string
	family rules.Family
}

// record is what the last successful reconcile of (fix, family) rendered and found in the kernel
// after. It holds digests, not texts: at 10,000 map entries the texts were 20,000 rules twice.
type record struct {
	// rs is the ruleset reconciled (shared with the caller, never modified): a reconcile of an equal
	// ruleset renders nothing, and one that differs only in map entries renders only their buckets.
	rs *rules.Ruleset
	// content is each chain's rendered rules (digest), parent its dispatching chain if it is a lookup
	// bucket.
	content  map[tchain]uint64
	parent   map[tchain]string
	jumps    string
	chains   map[tchain]bool
	counters []string
	// precede is the ruleset's Chain.Precedes: what our jumps must stand ahead of.
	precede precedence
	state   kstate
	// gen is the nf_tables generation at which the record is known to match the kernel.
	gen nfgen.Stamp
}

// rendering is what Apply compares with a record.
type rendering struct {
	chains  []*rchain
	set     map[tchain]bool
	content map[tchain]uint64
	parent  map[tchain]string
	jumps   string
	precede precedence
}

func newRendering(chains []*rchain, jumps []hookJump, precede precedence) *rendering {
	r := &rendering{chains: chains, set: map[tchain]bool{}, content: map[tchain]uint64{}, parent: map[tchain]string{}, precede: precede}
	for _, c := range chains {
		r.set[c.key()] = true
		r.content[c.key()] = c.digest()
		if c.parent != "" {
			r.parent[c.key()] = c.parent
		}
	}
	var b strings.Builder
	for _, j := range jumps {
		fmt.Fprintf(&b, "%s %s %s %s\n", j.table, j.builtin, j.chain, precede.list(tchain{j.table, j.chain}))
	}
	r.jumps = b.String()
	return r
}

// same reports whether r renders exactly what rec recorded.
func (r *rendering) same(rec *record) bool {
	if r.jumps != rec.jumps || len(r.content) != len(rec.content) {
		return false
	}
	for k, v := range r.content {
		if w, ok := rec.content[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// New validates opts; it does no I/O.
func New(opts Options) (*Backend, error) {
	switch opts.Variant {
	case NFT, Legacy:
	default:
		return nil, fmt.Errorf("iptables variant %q: want %q or %q", opts.Variant, NFT, Legacy)
	}
	if opts.LockWait < 0 {
		return nil, fmt.Errorf("iptables lock wait %d: must not be negative", opts.LockWait)
	}
	if opts.LockWait == 0 {
		opts.LockWait = 5
	}
	if opts.Generation == nil && opts.Runner == nil && opts.Variant == NFT {
		opts.Generation = nfgen.Get
	}
	if opts.Variant == Legacy {
		opts.Generation = nil
	}
	if opts.Runner == nil {
		opts.Runner = ExecRunner{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Backend{
		variant:  opts.Variant,
		lockWait: opts.LockWait,
		run:      opts.Runner,
		log:      opts.Logger.With("backend", "iptables", "variant", string(opts.Variant)),
		gen:      opts.Generation,
		applied:  map[key]*record{},
		absent:   map[key]nfgen.Stamp{},
	}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "iptables" }

// Binary is the path-less name of the variant's tool for family: tool is "restore", "save", or ""
// for iptables itself.
func (b *Backend) Binary(family rules.Family, tool string) string {
	base := "iptables"
	if family == rules.IPv6 {
		base = "ip6tables"
	}
	if tool == "" {
		return base + "-" + string(b.variant)
	}
	return base + "-" + string(b.variant) + "-" + tool
}

// Render implements backend.Backend: the iptables-restore --noflush input that programs rs on a
// kernel that holds none of it yet (Apply leaves out jumps that exist and adds removals of stale chains).
func (b *Backend) Render(rs *rules.Ruleset) (string, error) {
	if err := rs.Validate(); err != nil {
		return "", err
	}
	p, _, _, err := planRuleset(rs)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

// Reconcile implements backend.Backend.
//
// The record of (fix, family) holds what the last reconcile rendered and the fix's chains (and the
// jumps to them) as iptables-save showed them right after. With the nft variant the record is stamped
// with the nf_tables generation at which it matched the kernel: a Verify that finds the generation
// unchanged runs nothing; otherwise (and always with the legacy variant, which has no generation) it
// runs one iptables-save and compares. Trust, and Verify once the record is confirmed, run nothing
// when nothing changed; when only the contents of chains changed (map entries: lookup buckets) one
// iptables-restore rewrites just those chains, which are then listed for the record. Otherwise (no
// record, drift, other chains or jumps): iptables-save, one iptables-restore and an iptables-save to
// record the result.
func (b *Backend) Reconcile(ctx context.Context, fix string, family rules.Family, rs *rules.Ruleset, mode backend.Mode) (backend.Result, error) {
	var res backend.Result
	if rs == nil {
		return b.remove(ctx, fix, family, mode)
	}
	if rs.Fix != fix || rs.Family != family {
		return res, fmt.Errorf("iptables backend: ruleset of %s/%s reconciled as %s/%s", rs.Fix, rs.Family, fix, family)
	}
	if err := rs.Validate(); err != nil {
		return res, err
	}
	k := key{rs.Fix, rs.Family}

	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.absent, k)
	rec := b.applied[k]
	trusted := rec
	g0, genOK := b.generation()
	var d *dump
	var err error
	if trusted != nil && mode == backend.Verify && !trusted.gen.Is(g0, genOK) {
		res.ReadBack = true
		if d, err = b.save(ctx, rs.Family); err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, err
		}
		if d.state(trusted.chains, trusted.precede).equal(trusted.state) {
			trusted.gen = nfgen.At(g0, genOK)
		} else {
			b.log.Warn("rules changed behind our back; restoring them", "fix", fix, "family", family)
			res.Repaired = true
			trusted = nil
		}
	}
	if trusted != nil && trusted.rs.Equal(rs) {
		b.log.Debug("rules unchanged", "fix", rs.Fix, "family", rs.Family, "mode", mode)
		return res, nil
	}
	if trusted != nil && trusted.rs.SameExceptEntries(rs) {
		if done, err := b.applyEntries(ctx, rs, trusted, g0, genOK); errors.Is(err, errShortWay) {
			trusted = nil // the record proved wrong: take the full way
		} else if done || err != nil {
			res.Applied = done
			return res, err
		}
	}
	p, rchains, jumps, err := planRuleset(rs)
	if err != nil {
		return res, err
	}
	r := newRendering(rchains, jumps, precedenceOf(rs))
	chains := r.set
	var counters []string
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if r.Counter != "" {
				counters = append(counters, r.Counter)
			}
		}
	}
	if trusted != nil && r.same(trusted) {
		trusted.rs = rs.Clone()
		b.log.Debug("rules unchanged", "fix", rs.Fix, "family", rs.Family, "mode", mode)
		return res, nil
	}
	if trusted != nil {
		if done, err := b.applyChanged(ctx, rs, r, trusted, counters, g0, genOK); errors.Is(err, errShortWay) {
			trusted = nil // the record proved wrong: take the full way
		} else if done || err != nil {
			res.Applied = done
			return res, err
		}
	}
	if d == nil {
		res.ReadBack = true
		if d, err = b.save(ctx, rs.Family); err != nil {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, err
		}
	}
	ctx = context.WithoutCancel(ctx) // from here on the kernel is changed: finish what was started

	// Chains of the fix now: what the kernel says, and what this process applied last.
	owners := d.owners()
	old := d.owned(rs.Fix)
	if rec != nil {
		for c := range rec.chains {
			if d.has(c) {
				old[c] = true
			}
		}
	}
	for c := range chains {
		if o, ok := owners[c]; ok && o != rs.Fix {
			return res, fmt.Errorf("fix %s: chain %s is already used by fix %s", rs.Fix, c, o)
		}
	}

	// The position policy (README, "Position among other agents"): a wanted jump that is there,
	// unaltered, stays where it is, whatever foreign rules stand before it (another agent inserting
	// its own jump first is no reason to move ours: both would do it forever). It is deleted and
	// inserted again at the top only when it stands behind a jump to a chain it must precede
	// (Chain.Precedes: kube-proxy's KUBE-SERVICES in nat PREROUTING would ACCEPT a LoadBalancer's
	// traffic before our DNAT). Jumps of the fix that the ruleset no longer wants, altered ones and
	// duplicates are deleted; missing ones are inserted at the top.
	prec := r.precede
	want := map[hookJump]bool{}
	for _, j := range jumps {
		want[j] = true
	}
	have := map[hookJump]bool{}
	for _, t := range d.tables {
		for _, c := range t.chains {
			if !c.builtin() {
				continue
			}
			seen := map[string]bool{} // foreign chains jumped to so far in c
			for _, r := range c.rules {
				j := hookJump{t.name, c.name, r.target}
				switch {
				case r.comment != jumpCommentPrefix+rs.Fix || !isOurs(r.target):
					if !isOurs(r.target) && r.target != "" {
						seen[r.target] = true
					}
				case want[j] && !have[j] && r.spec == jumpSpec(rs.Fix, r.target) && !prec.blocked(tchain{t.name, r.target}, seen):
					have[j] = true
				default:
					p.table(t.name).deletes = append(p.table(t.name).deletes, "-D "+c.name+" "+r.spec)
				}
			}
		}
	}
	for t, ops := range p {
		ops.inserts = slicesFilter(ops.inserts, func(line string) bool {
			for j := range have {
				if j.table == t && line == "-I "+j.builtin+" 1 "+jumpSpec(rs.Fix, j.chain) {
					return false
				}
			}
			return true
		})
	}
	for _, j := range jumps {
		if have[j] || len(prec[tchain{j.table, j.chain}]) == 0 {
			continue
		}
		line := "-I " + j.builtin + " 1 " + jumpSpec(rs.Fix, j.chain)
		ops := p.table(j.table)
		if i := slices.Index(ops.inserts, line); i >= 0 {
			ops.inserts[i] = insertAt(d, j, prec[tchain{j.table, j.chain}], ops.deletes, jumpSpec(rs.Fix, j.chain))
		}
	}
	stale := map[tchain]bool{}
	for c := range old {
		if !chains[c] {
			stale[c] = true
		}
	}
	removeChains(p, d, stale, chains)

	input := p.String()
	if input != "" {
		if err := b.restore(ctx, rs.Family, input); err != nil {
			// The restore is atomic: the kernel holds what it held, and the record stays true
			// unless this call found it wrong.
			if res.Repaired {
				b.setApplied(k, nil)
			}
			return res, fmt.Errorf("fix %s (%s): %w", rs.Fix, rs.Family, err)
		}
		res.Applied = true
	}
	g1, ok1 := b.generation()
	after, err := b.save(ctx, rs.Family)
	if err != nil {
		b.setApplied(k, nil)
		return res, err
	}
	nrec := &record{rs: rs.Clone(), content: r.content, parent: r.parent, jumps: r.jumps, chains: chains, counters: counters, precede: r.precede, state: after.state(chains, r.precede)}
	if g2, ok2 := b.generation(); ok1 && ok2 && g1 == g2 {
		nrec.gen = nfgen.At(g2, true)
	}
	b.setApplied(k, nrec)
	if res.Applied {
		b.log.Info("rules applied", "fix", rs.Fix, "family", rs.Family, "chains", len(chains), "removed_chains", len(stale), "rules", rs.RuleCount())
	}
	return res, nil
}

// setApplied records (rec) or forgets (nil) what the kernel holds for k. Call with b.mu held.
func (b *Backend) setApplied(k key, rec *record) {
	b.amu.Lock()
	defer b.amu.Unlock()
	if rec == nil {
		delete(b.applied, k)
	} else {
		b.applied[k] = rec
	}
}

// generation reads the nf_tables generation; false without one.
func (b *Backend) generation() (uint32, bool) { return b.gen.Read(b.log) }

// promote carries the records (and known absences) that matched the kernel at generation g0 over
// to g1, after only our own commits moved the generation. Call with b.mu held.
func (b *Backend) promote(g0, g1 uint32) {
	for _, rec := range b.applied {
		rec.gen = rec.gen.Promoted(g0, g1)
	}
	for k, st := range b.absent {
		b.absent[k] = st.Promoted(g0, g1)
	}
}

// applyChanged is Reconcile's short way for a ruleset that differs from the record only in the contents
// of chains (typically map entries, which live in lookup buckets): the same jumps, and the chains that
// appear or disappear are buckets whose dispatching chain is rewritten too. It trusts the record
// instead of reading the whole kernel first, rewrites only the changed chains, deletes the buckets
// gone, and lists the rewritten chains to update the record. It returns false without having changed
// anything when the change is not of that kind, and errShortWay when the restore failed (Reconcile
// then takes the long way, which reads the kernel and repairs whatever the record missed).
func (b *Backend) applyChanged(ctx context.Context, rs *rules.Ruleset, r *rendering, prev *record, counters []string, g0 uint32, genOK bool) (bool, error) {
	if r.jumps != prev.jumps {
		return false, nil
	}
	for c := range r.set {
		if !prev.chains[c] && r.parent[c] == "" {
			return false, nil // a new chain that is not a bucket: check ownership the long way
		}
	}
	var changed []*rchain
	rewritten := map[tchain]bool{}
	for _, c := range r.chains {
		if w, ok := prev.content[c.key()]; !ok || w != r.content[c.key()] {
			changed = append(changed, c)
			rewritten[c.key()] = true
		}
	}
	var stale []tchain
	for c := range prev.chains {
		if r.set[c] {
			continue
		}
		par, ok := prev.parent[c]
		if !ok || !rewritten[tchain{c.table, par}] {
			return false, nil // not a bucket whose dispatch rule goes with its parent's rewrite
		}
		stale = append(stale, c)
	}
	sort.Slice(stale, func(i, j int) bool { return stale[i].String() < stale[j].String() })

	nrec := &record{rs: rs.Clone(), content: r.content, parent: r.parent, jumps: r.jumps, chains: r.set, counters: counters, precede: r.precede}
	return b.rewriteChains(ctx, rs, changed, stale, prev, nrec, g0, genOK)
}

// errShortWay: a restore built from the record failed, so the record is not to be trusted. The
// kernel is unchanged (the restore is atomic); Reconcile then reads it and applies in full.
var errShortWay = errors.New("rewrite from the record failed")

// rewriteChains rewrites the changed chains and deletes the stale ones with one iptables-restore,
// lists the rewritten chains, and records the result as nrec (whose rendering the caller filled in).
// It returns errShortWay, having changed nothing, when the restore failed.
func (b *Backend) rewriteChains(ctx context.Context, rs *rules.Ruleset, changed []*rchain, stale []tchain, prev, nrec *record, g0 uint32, genOK bool) (bool, error) {
	rewritten := map[tchain]bool{}
	for _, c := range changed {
		rewritten[c.key()] = true
	}
	p := plan{}
	for _, c := range changed {
		ops := p.table(c.table)
		ops.decls = append(ops.decls, c.name)
		ops.appends = append(ops.appends, c.lines...)
	}
	for _, c := range stale {
		p.table(c.table).flushes = append(p.table(c.table).flushes, c.chain)
		p.table(c.table).removes = append(p.table(c.table).removes, c.chain)
	}
	ctx = context.WithoutCancel(ctx)
	input := p.String()
	if err := b.restore(ctx, rs.Family, input); err != nil {
		b.log.Warn("rewriting changed chains failed; reading the kernel and applying in full", "fix", rs.Fix, "family", rs.Family, "error", err)
		return false, errShortWay
	}
	// iptables-nft-restore commits once per table section, each with a real change here: when the
	// generation moved by exactly that much, nobody else committed in between.
	g1, ok1 := b.generation()
	ours := ok1 && genOK && g1 == g0+uint32(strings.Count("\n"+input, "\n*"))
	if ours {
		b.promote(g0, g1)
	}
	k := key{rs.Fix, rs.Family}
	st := kstate{own: map[tchain]uint64{}, others: prev.state.others}
	for c, v := range prev.state.own {
		if nrec.chains[c] && !rewritten[c] {
			st.own[c] = v
		}
	}
	for _, c := range changed {
		saved, err := b.list(ctx, rs.Family, c.table, c.name)
		if err != nil {
			b.setApplied(k, nil)
			return false, err
		}
		st.own[c.key()] = chainState(c.name, saved)
	}
	nrec.state = st
	if g2, ok2 := b.generation(); ours && ok2 && g2 == g1 && prev.gen.Is(g1, true) {
		nrec.gen = nfgen.At(g1, true)
	}
	b.setApplied(k, nrec)
	b.log.Info("rules applied", "fix", rs.Fix, "family", rs.Family, "rewritten_chains", len(changed), "removed_chains", len(stale), "rules", rs.RuleCount())
	return true, nil
}

// removeChains adds to p the deletion of the chains gone: first every rule elsewhere that jumps to
// them (except from chains that p re-declares, which are flushed anyway), then flush, then delete.
func removeChains(p plan, d *dump, gone, keep map[tchain]bool) {
	if len(gone) == 0 {
		return
	}
	for _, t := range d.tables {
		for _, c := range t.chains {
			k := tchain{t.name, c.name}
			if gone[k] || keep[k] {
				continue
			}
			for _, r := range c.rules {
				line := "-D " + c.name + " " + r.spec
				if gone[tchain{t.name, r.target}] && !containsStr(p.table(t.name).deletes, line) {
					p.table(t.name).deletes = append(p.table(t.name).deletes, line)
				}
			}
		}
	}
	names := make([]tchain, 0, len(gone))
	for c := range gone {
		names = append(names, c)
	}
	sort.Slice(names, func(i, j int) bool { return names[i].String() < names[j].String() })
	for _, c := range names {
		p.table(c.table).flushes = append(p.table(c.table).flushes, c.chain)
		p.table(c.table).removes = append(p.table(c.table).removes, c.chain)
	}
}

// remove deletes the chains of fix in family. Without memory of a reconcile it finds the fix's chains
// from its jump comments in the kernel. One iptables-save, and one iptables-restore if anything is
// there; nothing at all when the fix is known to be gone (Trust, or Verify with an unchanged
// generation).
func (b *Backend) remove(ctx context.Context, fix string, family rules.Family, mode backend.Mode) (backend.Result, error) {
	var res backend.Result
	b.mu.Lock()
	defer b.mu.Unlock()
	k := key{fix, family}
	g0, genOK := b.generation()
	if st, ok := b.absent[k]; ok && (mode == backend.Trust || st.Is(g0, genOK)) {
		return res, nil
	}
	res.ReadBack = true
	d, err := b.save(ctx, family)
	if err != nil {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		return res, err
	}
	gone := d.owned(fix)
	if prev := b.applied[k]; prev != nil {
		for c := range prev.chains {
			if d.has(c) {
				gone[c] = true
			}
		}
	}
	p := plan{}
	removeChains(p, d, gone, nil)
	if input := p.String(); input != "" {
		if err := b.restore(context.WithoutCancel(ctx), family, input); err != nil {
			return res, fmt.Errorf("remove fix %s (%s): %w", fix, family, err)
		}
		res.Applied = true
		b.log.Info("rules removed", "fix", fix, "family", family, "chains", len(gone))
	}
	b.setApplied(k, nil)
	g1, ok1 := b.generation()
	b.absent[k] = nfgen.At(g1, ok1)
	return res, nil
}

// Counters implements backend.Backend: it sums the packets and bytes of the kernel rules whose comment
// names the counter ("<fix>/<counter>: …"), over every rule a map or prefix list expanded into.
//
// It does not wait for b.mu: iptables-save reads without the xtables lock, and a scrape must not
// queue behind an iptables-restore that waits for a lock another process holds (#15 item 3).
func (b *Backend) Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error) {
	b.amu.Lock()
	prev := b.applied[key{fix, family}] // its chains and counters never change once stored
	b.amu.Unlock()
	d, err := b.save(ctx, family)
	if err != nil {
		return nil, err
	}
	chains := d.owned(fix)
	out := map[string]backend.Counter{}
	if prev != nil {
		for c := range prev.chains {
			chains[c] = true
		}
		for _, n := range prev.counters {
			out[n] = backend.Counter{}
		}
	}
	for _, t := range d.tables {
		for _, c := range t.chains {
			if !chains[tchain{t.name, c.name}] {
				continue
			}
			for _, r := range c.rules {
				if n, ok := counterOf(fix, r.comment); ok {
					v := out[n]
					v.Packets += r.packets
					v.Bytes += r.bytes
					out[n] = v
				}
			}
		}
	}
	return out, nil
}

// Cleanup implements backend.Backend: in both families and every table it deletes all NNM- chains and
// the predecessor's NMANAGER_ chains, and every rule jumping to them. Foreign rules stay.
func (b *Backend) Cleanup(ctx context.Context) error {
	var errs []error
	for _, f := range rules.Families {
		_, err := b.cleanup(ctx, f, cleanupMatch)
		errs = append(errs, err)
	}
	b.mu.Lock()
	b.amu.Lock()
	clear(b.applied)
	b.amu.Unlock()
	clear(b.absent)
	b.mu.Unlock()
	return errors.Join(errs...)
}

// RemoveAll deletes every NNM- chain in every table of family, with every rule jumping to them, and
// returns how many chains it removed: what this backend left when the agent runs with the nftables
// backend now (backends.Leftovers). Unlike Cleanup it leaves the predecessor's chains alone.
func (b *Backend) RemoveAll(ctx context.Context, family rules.Family) (removed int, err error) {
	removed, err = b.cleanup(ctx, family, isOurs)
	b.mu.Lock()
	b.amu.Lock()
	for k := range b.applied {
		if k.family == family {
			delete(b.applied, k)
		}
	}
	b.amu.Unlock()
	b.mu.Unlock()
	return removed, err
}

// CleanupPredecessor removes the chains of Kakao's network-node-manager (NMANAGER_*, any table) and
// the rules jumping to them in family, leaving ours alone. It returns how many chains it removed.
func (b *Backend) CleanupPredecessor(ctx context.Context, family rules.Family) (int, error) {
	return b.cleanup(ctx, family, func(c string) bool { return strings.HasPrefix(c, PredecessorChainPrefix) })
}

func (b *Backend) cleanup(ctx context.Context, family rules.Family, match func(string) bool) (removed int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out, err := b.saveRaw(ctx, family)
	if err != nil {
		return 0, err
	}
	if !declares(out, match) {
		// The common case (the predecessor's takeover once at start, next to 20,000 rules of
		// ours): the chain declarations say there is nothing to do, and no rule is parsed.
		return 0, nil
	}
	d, err := parseDump(b.Binary(family, "save"), out)
	if err != nil {
		return 0, err
	}
	gone := map[tchain]bool{}
	for _, t := range d.tables {
		for _, c := range t.chains {
			if !c.builtin() && match(c.name) {
				gone[tchain{t.name, c.name}] = true
			}
		}
	}
	p := plan{}
	removeChains(p, d, gone, nil)
	if input := p.String(); input != "" {
		if err := b.restore(ctx, family, input); err != nil {
			return 0, fmt.Errorf("cleanup (%s): %w", family, err)
		}
		b.log.Info("chains cleaned up", "family", family, "chains", len(gone))
	}
	return len(gone), nil
}

// save runs iptables-save -c for all tables of family.
func (b *Backend) save(ctx context.Context, family rules.Family) (*dump, error) {
	out, err := b.saveRaw(ctx, family)
	if err != nil {
		return nil, err
	}
	return parseDump(b.Binary(family, "save"), out)
}

// saveRaw runs iptables-save -c of family.
func (b *Backend) saveRaw(ctx context.Context, family rules.Family) ([]byte, error) {
	bin := b.Binary(family, "save")
	out, stderr, err := b.run.Run(ctx, bin, []string{"-c"}, nil)
	if err != nil {
		return nil, fmt.Errorf("%s -c: %w: %s", bin, err, strings.TrimSpace(string(stderr)))
	}
	return out, nil
}

func parseDump(bin string, out []byte) (*dump, error) {
	d, err := parseSave(string(out))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return d, nil
}

// declares reports whether an iptables-save output declares a chain (":NAME POLICY [p:b]") whose
// name matches, without parsing any rule.
func declares(out []byte, match func(string) bool) bool {
	for line := range bytes.Lines(out) {
		if len(line) < 2 || line[0] != ':' {
			continue
		}
		name, _, _ := bytes.Cut(line[1:], []byte(" "))
		if match(string(bytes.TrimSpace(name))) {
			return true
		}
	}
	return false
}

// list runs iptables -S CHAIN: the chain's rules in iptables-save's format, without reading the
// rest of the kernel's rules into text.
func (b *Backend) list(ctx context.Context, family rules.Family, table, chain string) ([]*savedRule, error) {
	bin := b.Binary(family, "")
	args := []string{"-w", strconv.Itoa(b.lockWait), "-t", table, "-S", chain}
	out, stderr, err := b.run.Run(ctx, bin, args, nil)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(stderr)))
	}
	return parseList(chain, string(out))
}

var lineNo = regexp.MustCompile(`line:? (\d+)`)

// restore feeds input to iptables-restore --noflush in one transaction per table. The error names the
// tool's message and the input line it complains about.
func (b *Backend) restore(ctx context.Context, family rules.Family, input string) error {
	bin := b.Binary(family, "restore")
	_, stderr, err := b.run.Run(ctx, bin, []string{"-w", strconv.Itoa(b.lockWait), "--noflush"}, []byte(input))
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(string(stderr))
	if m := lineNo.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		if lines := strings.Split(input, "\n"); n >= 1 && n <= len(lines) {
			msg += fmt.Sprintf(" (input line %d: %s)", n, lines[n-1])
		}
	}
	return fmt.Errorf("%s --noflush: %w: %s", bin, err, msg)
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func slicesFilter(in []string, keep func(string) bool) []string {
	out := in[:0]
	for _, s := range in {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// insertAt places a missing jump that must precede some foreign chains (Chain.Precedes) without
// contending for position 1: directly ahead of the first jump to one of those chains, so that other
// agents' jumps above it (Felix's cali-PREROUTING) keep their place, or, when none of them is in the
// built-in chain, at its end (the chain it must precede, inserted later at the top, then costs one
// repair, once: its owner does not move it back). Positions count the rules left after this
// restore's deletes, which iptables-restore applies first.
func insertAt(d *dump, j hookJump, precede []string, deletes []string, spec string) string {
	var c *chain
	if t := d.table(j.table); t != nil {
		c = t.byName[j.builtin]
	}
	if c == nil {
		return "-I " + j.builtin + " 1 " + spec
	}
	pos := 1
	for _, r := range c.rules {
		if slices.Contains(precede, r.target) {
			return "-I " + j.builtin + " " + strconv.Itoa(pos) + " " + spec
		}
		if !slices.Contains(deletes, "-D "+j.builtin+" "+r.spec) {
			pos++
		}
	}
	return "-A " + j.builtin + " " + spec
}
