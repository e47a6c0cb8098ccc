// Package iptables is the iptables backend: it programs the NNM- chains of each fix with one
// iptables-restore --noflush transaction per (fix, family), for IPv4 and IPv6 through one code path.
package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/nfgen"
	"github.com/network-node-manager/network-node-manager/internal/toolslot"
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
	Generation backend.Generation
}

// Backend is the iptables backend: the shared Driver over this package's Ops.
type Backend = backend.Driver[*record]

// Ops are the iptables backend's operations (backend.Ops) with iptables-restore/iptables-save,
// and what it offers beyond them (RemoveAll, RemoveFix, CleanupPredecessor, CleanupPlan).
//
// The record of a unit holds what its last change rendered (chain digests) and its chains (and the
// jumps to them) as iptables-save showed them right after. Matches runs one iptables-save and
// compares. Update, for a change in the contents of chains only (map entries live in lookup
// buckets), rewrites just those chains with one iptables-restore and lists them with iptables -S.
// Apply and Remove read the whole ruleset, place or delete our jumps in the built-in chains and
// check chain ownership: they hold b.shared, which nothing else of the backend waits for.
type Ops struct {
	variant  Variant
	lockWait int
	run      Runner
	log      *slog.Logger
	gen      backend.Generation

	// shared is held by the operations that read the whole ruleset to change what units share: our
	// jumps in the built-in chains (whose positions are computed from that reading) and chain
	// ownership. Updates of a unit's own chains, read-backs and counters never wait for it.
	shared sync.Mutex

	// umu guards unparsed: per iptables-save binary, the first line of its last dump that could not
	// be parsed ("" for none), so that they are logged when they change, not on every read.
	umu      sync.Mutex
	unparsed map[string]string

	// scrapes shares one dump of a family among the Counters calls that overlap it: a scrape
	// collects every fix's counters at once, and each would otherwise queue for a dump of its own.
	scrapes singleflight.Group
}

var _ backend.Ops[*record] = (*Ops)(nil)

// record is what the last successful reconcile of (fix, family) rendered and found in the kernel
// after. It holds digests, not texts: at 10,000 map entries the texts were 20,000 rules twice.
type record struct {
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

// New returns the backend: the Driver over NewOps(opts). It does no I/O.
func New(opts Options) (*Backend, error) {
	b, err := NewOps(opts)
	if err != nil {
		return nil, err
	}
	return backend.New[*record](b, b.gen, b.log), nil
}

// NewOps validates opts and returns the backend's operations; it does no I/O. Driven by nothing
// (no records), they remove what another agent's run left (backends.Leftovers).
func NewOps(opts Options) (*Ops, error) {
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
	b := &Ops{
		gen:      opts.Generation,
		variant:  opts.Variant,
		lockWait: opts.LockWait,
		run:      opts.Runner,
		log:      opts.Logger.With("backend", backend.IPTables, "variant", string(opts.Variant)),
	}
	return b, nil
}

// Name is part of backend.Ops.
func (b *Ops) Name() string { return backend.IPTables }

// Binary is the path-less name of the variant's tool for family: tool is "restore", "save", or ""
// for iptables itself.
func (b *Ops) Binary(family rules.Family, tool string) string {
	base := "iptables"
	if family == rules.IPv6 {
		base = "ip6tables"
	}
	if tool == "" {
		return base + "-" + string(b.variant)
	}
	return base + "-" + string(b.variant) + "-" + tool
}

// Render is part of backend.Ops: the iptables-restore --noflush input that programs rs on a
// kernel that holds none of it yet (Apply leaves out jumps that exist and adds removals of stale chains).
func (b *Ops) Render(rs *rules.Ruleset) (string, error) {
	if err := rs.Validate(); err != nil {
		return "", err
	}
	p, _, _, err := planRuleset(rs)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

// Begin is part of backend.Ops: every fix id names chains.
func (b *Ops) Begin(context.Context, backend.Unit, backend.Mode) error { return nil }

func (b *Ops) Matches(ctx context.Context, u backend.Unit, rec *record) (bool, error) {
	d, err := b.save(ctx, u.Family)
	if err != nil {
		return false, err
	}
	return d.state(rec.chains, rec.precede).equal(rec.state), nil
}

func (b *Ops) Update(ctx context.Context, u backend.Unit, prev backend.Prev[*record], c backend.Change) (backend.Step[*record], error) {
	rec, rs := prev.Rec, c.To
	if err := rs.Validate(); err != nil {
		return backend.Step[*record]{}, err
	}
	if !c.Chains {
		if step, err := b.applyEntries(ctx, c.From, rs, rec, prev.Exact); step.Done || err != nil {
			return step, err
		}
	}
	_, rchains, jumps, err := planRuleset(rs)
	if err != nil {
		return backend.Step[*record]{}, err
	}
	r := newRendering(rchains, jumps, precedenceOf(rs))
	if r.same(rec) {
		return backend.Step[*record]{Done: true, Rec: rec}, nil
	}
	return b.applyChanged(ctx, rs, r, rec)
}

// Apply is the long way: iptables-save, one iptables-restore, and an iptables-save for the record.
func (b *Ops) Apply(ctx context.Context, u backend.Unit, prev backend.Prev[*record], rs *rules.Ruleset) (backend.Step[*record], error) {
	var step backend.Step[*record]
	if err := rs.Validate(); err != nil {
		return step, err
	}
	p, rchains, jumps, err := planRuleset(rs)
	if err != nil {
		return step, err
	}
	r := newRendering(rchains, jumps, precedenceOf(rs))
	b.shared.Lock()
	defer b.shared.Unlock()
	step.ReadBack = true
	d, err := b.save(ctx, rs.Family)
	if err != nil {
		return step, err
	}
	ctx = context.WithoutCancel(ctx) // from here on the kernel is changed: finish what was started
	// Chains of the fix now: what the kernel says, and what this process applied last.
	old := d.owned(rs.Fix)
	if prev.Known {
		for c := range prev.Rec.chains {
			if d.has(c) {
				old[c] = true
			}
		}
	}
	owners := d.owners()
	for _, c := range slices.SortedFunc(maps.Keys(r.set), func(a, b tchain) int { return strings.Compare(a.String(), b.String()) }) {
		if o, ok := owners[c]; ok && o != rs.Fix {
			return step, fmt.Errorf("chain %s is already used by fix %s", c, o)
		}
		// A chain of the name that is not the fix's (by the kernel's marks or our record) is
		// someone else's, as cleanup judges it: declaring it in the restore would flush it (issue
		// #63). It stays as it is, and the unit is not applied.
		if d.has(c) && !old[c] {
			return step, &backend.ForeignError{Object: fmt.Sprintf("chain %s of table %s (%s)", c.chain, c.table, b.Binary(rs.Family, "")),
				Why: "no jump commented " + jumpCommentPrefix + rs.Fix + " in a built-in chain leads to it, nor did this agent make it"}
		}
	}
	placeJumps(p, d, rs.Fix, jumps, r.precede)
	stale := map[tchain]bool{}
	for c := range old {
		if !r.set[c] {
			stale[c] = true
		}
	}
	removeChains(p, d, stale, r.set)
	if p.commits(rs.Fix) > 0 {
		if err := b.restore(ctx, rs.Family, rs.Fix, p); err != nil {
			return step, err // the restore is atomic: the kernel holds what it held
		}
		step.Applied = true
		b.log.Info("rules applied", "fix", rs.Fix, "family", rs.Family, "chains", len(r.set), "removed_chains", len(stale), "rules", rs.RuleCount())
	}
	rec := r.record(countersOf(rs))
	step.Rec = rec
	step.Finish = func(ctx context.Context) (*record, error) {
		after, err := b.save(ctx, rs.Family)
		if err != nil {
			return nil, err
		}
		if err := after.holds(rs.Fix, rchains, jumps, r.precede); err != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrInterfered, err)
		}
		rec.state = after.state(rec.chains, rec.precede)
		return rec, nil
	}
	return step, nil
}

// record is a record of r, without the kernel's state (which the caller lists after applying).
func (r *rendering) record(counters []string) *record {
	return &record{content: r.content, parent: r.parent, jumps: r.jumps, chains: r.set, counters: counters, precede: r.precede}
}

func countersOf(rs *rules.Ruleset) []string {
	var counters []string
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if r.Counter != "" {
				counters = append(counters, r.Counter)
			}
		}
	}
	return counters
}

// placeJumps applies the position policy (README, "Position among other agents") to the jumps of
// fix that p inserts: a wanted jump that is there, unaltered, stays where it is, whatever foreign
// rules stand before it (another agent inserting its own jump first is no reason to move ours: both
// would do it forever). It is deleted and inserted again only when it stands behind a jump to a
// chain it must precede (Chain.Precedes: kube-proxy's KUBE-SERVICES in nat PREROUTING would ACCEPT a
// LoadBalancer's traffic before our DNAT); such a jump goes directly ahead of that chain (insertAt).
// Jumps of the fix that the ruleset no longer wants, altered ones and duplicates are deleted;
// missing ones are inserted at the top.
func placeJumps(p plan, d *dump, fix string, jumps []hookJump, prec precedence) {
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
			c.walk(func(r *savedRule, before map[string]bool) bool {
				j := hookJump{t.name, c.name, r.target}
				switch {
				case r.comment != jumpCommentPrefix+fix || !isOurs(r.target):
				case want[j] && !have[j] && r.spec == jumpSpec(fix, r.target) && !prec.blocked(tchain{t.name, r.target}, before):
					have[j] = true
				default:
					p.table(t.name).deletes = append(p.table(t.name).deletes, "-D "+c.name+" "+r.spec)
				}
				return true
			})
		}
	}
	for _, j := range jumps {
		ops := p.table(j.table)
		i := slices.Index(ops.inserts, "-I "+j.builtin+" 1 "+jumpSpec(fix, j.chain))
		switch {
		case i < 0:
		case have[j]:
			ops.inserts = slices.Delete(ops.inserts, i, i+1)
		case len(prec[tchain{j.table, j.chain}]) > 0:
			ops.inserts[i] = insertAt(d, j, prec[tchain{j.table, j.chain}], ops.deletes, jumpSpec(fix, j.chain))
		}
	}
}

// applyChanged is Update's way for a ruleset that differs from the record only in the contents of
// chains (typically map entries, which live in lookup buckets): the same jumps, and the chains that
// appear or disappear are buckets whose dispatching chain is rewritten too. It rewrites only the
// changed chains and deletes the buckets gone. Done is false, with nothing changed, when the change
// is not of that kind.
func (b *Ops) applyChanged(ctx context.Context, rs *rules.Ruleset, r *rendering, prev *record) (backend.Step[*record], error) {
	var no backend.Step[*record]
	if r.jumps != prev.jumps {
		return no, nil
	}
	for c := range r.set {
		if !prev.chains[c] && r.parent[c] == "" {
			return no, nil // a new chain that is not a bucket: check ownership the long way
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
			return no, nil // not a bucket whose dispatch rule goes with its parent's rewrite
		}
		stale = append(stale, c)
	}
	sort.Slice(stale, func(i, j int) bool { return stale[i].String() < stale[j].String() })
	return b.rewriteChains(ctx, rs, changed, nil, stale, nil, prev, r.record(countersOf(rs)))
}

// rewriteChains rewrites the changed chains (or edits those that edits has an edit for) and deletes
// the stale ones with one iptables-restore; the step's Finish lists the changed chains for the
// record nrec (whose rendering the caller filled in). It returns backend.ErrStale, having changed
// nothing, when the restore failed (an edit's delete names a rule that is not there, an insert a
// position beyond the chain's end).
func (b *Ops) rewriteChains(ctx context.Context, rs *rules.Ruleset, changed []*rchain, edits map[tchain]edit, stale, drains []tchain, prev, nrec *record) (backend.Step[*record], error) {
	p := plan{}
	for _, c := range changed {
		ops := p.table(c.table)
		if e, ok := edits[c.key()]; ok {
			ops.deletes = append(ops.deletes, e.deletes...)
			ops.inserts = append(ops.inserts, e.inserts...)
			continue
		}
		ops.decls = append(ops.decls, c.name)
		ops.appends = append(ops.appends, c.lines...)
	}
	for _, c := range stale {
		p.table(c.table).flushes = append(p.table(c.table).flushes, c.chain)
		p.table(c.table).removes = append(p.table(c.table).removes, c.chain)
	}
	for _, c := range drains {
		p.table(c.table).drains = append(p.table(c.table).drains, c.chain)
	}
	if err := b.restore(ctx, rs.Family, rs.Fix, p); err != nil {
		b.log.Warn("rewriting changed chains failed", "fix", rs.Fix, "family", rs.Family, "error", err)
		return backend.Step[*record]{}, backend.ErrStale
	}
	b.log.Info("rules applied", "fix", rs.Fix, "family", rs.Family, "rewritten_chains", len(changed)-len(edits), "edited_chains", len(edits), "removed_chains", len(stale), "rules", rs.RuleCount())
	// iptables-nft-restore commits once per table section, each with a real change here.
	step := backend.Step[*record]{Done: true, Applied: true, Commits: p.commits(rs.Fix), Rec: nrec}
	step.Finish = func(ctx context.Context) (*record, error) {
		rewritten := map[tchain]bool{}
		for _, c := range changed {
			rewritten[c.key()] = true
		}
		st := kstate{own: map[tchain]uint64{}, others: prev.state.others}
		for c, v := range prev.state.own {
			if nrec.chains[c] && !rewritten[c] {
				st.own[c] = v
			}
		}
		read, err := b.readBack(ctx, rs.Family, changed)
		if err != nil {
			return nil, err
		}
		for _, c := range changed {
			n, sum, ok := read(c)
			if !ok || n != len(c.lines) {
				return nil, fmt.Errorf("%w: chain %s holds %d rules, %d were applied", backend.ErrInterfered, c.key(), n, len(c.lines))
			}
			st.own[c.key()] = sum
		}
		nrec.state = st
		return nrec, nil
	}
	return step, nil
}

// readBackListMax is the most chains a change reads back with one `iptables -S CHAIN` each; more
// are read from one iptables-save of the family. At 10,000 entries a list took 7-23 ms and a save
// about 200-300 ms (the backend's tool calls timed in a test namespace and in the scale bench,
// iptables-nft 1.8.9): one save is cheaper from about 15-30 chains. A change that adds thousands of Services at once (a cold start
// coalesced into changes, a watch reconnecting) rewrites a chain per bucket: with a list each, 1,400
// chains took minutes of process starts under emulation (make test-cluster's day 2).
const readBackListMax = 16

// readBack reads the changed chains back from the kernel: read(c) is how many rules chain c holds
// and their digest (chainState), ok false if the kernel has no such chain.
func (b *Ops) readBack(ctx context.Context, family rules.Family, changed []*rchain) (read func(c *rchain) (n int, sum uint64, ok bool), err error) {
	if len(changed) > readBackListMax {
		d, err := b.save(ctx, family)
		if err != nil {
			return nil, err
		}
		return func(c *rchain) (int, uint64, bool) {
			k := d.chain(c.key())
			if k == nil {
				return 0, 0, false
			}
			return k.n, k.sum, true
		}, nil
	}
	lists := make(map[tchain][]*savedRule, len(changed))
	for _, c := range changed {
		saved, err := b.list(ctx, family, c.table, c.name)
		if err != nil {
			return nil, err
		}
		lists[c.key()] = saved
	}
	return func(c *rchain) (int, uint64, bool) {
		saved := lists[c.key()]
		return len(saved), chainState(c.name, saved), true
	}, nil
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
				if gone[tchain{t.name, r.target}] && !slices.Contains(p.table(t.name).deletes, line) {
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

// Remove deletes the chains of the unit: those its jump comments in the kernel name, and those of
// the record. One iptables-save, and one iptables-restore if anything is there.
func (b *Ops) Remove(ctx context.Context, u backend.Unit, prev backend.Prev[*record]) (backend.Step[*record], error) {
	step := backend.Step[*record]{ReadBack: true}
	b.shared.Lock()
	defer b.shared.Unlock()
	d, err := b.save(ctx, u.Family)
	if err != nil {
		return step, err
	}
	gone := d.owned(u.Fix)
	if prev.Known {
		for c := range prev.Rec.chains {
			if d.has(c) {
				gone[c] = true
			}
		}
	}
	p := plan{}
	removeChains(p, d, gone, nil)
	if p.commits(u.Fix) > 0 {
		if err := b.restore(context.WithoutCancel(ctx), u.Family, u.Fix, p); err != nil {
			return step, err
		}
		step.Applied = true
		b.log.Info("rules removed", "fix", u.Fix, "family", u.Family, "chains", len(gone))
	}
	return step, nil
}

// Counters is part of backend.Ops: it sums the packets and bytes of the kernel rules whose comment
// names the counter ("<fix>/<counter>: …"), over every rule a map or prefix list expanded into.
//
// It waits for nothing of the backend's: iptables-save reads without the xtables lock, and a scrape
// must not queue behind an iptables-restore that waits for a lock another process holds.
func (b *Ops) Counters(ctx context.Context, u backend.Unit, prev *record, known bool) (map[string]backend.Counter, error) {
	fix, family := u.Fix, u.Family // prev is never changed once recorded
	// A dump that started after this call's scrape began is as good as one of its own: the dump is
	// only read, and counters are a sample.
	v, err, _ := b.scrapes.Do(string(family), func() (any, error) { return b.save(ctx, family) })
	if err != nil {
		return nil, err
	}
	d := v.(*dump)
	chains := d.owned(fix)
	out := map[string]backend.Counter{}
	if known {
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

// Cleanup is part of backend.Ops: in both families and every table it deletes all NNM- chains and
// the predecessor's NMANAGER_ chains, and every rule jumping to them. Foreign rules stay.
func (b *Ops) Cleanup(ctx context.Context) error {
	var errs []error
	for _, f := range rules.Families {
		_, err := b.cleanup(ctx, f, cleanupMatch)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// RemoveAll deletes every NNM- chain of ours (removable) in every table of family, with every rule jumping to them, and
// returns how many chains it removed: what this backend left when the agent runs with the nftables
// backend now (backends.Leftovers). Unlike Cleanup it leaves the predecessor's chains alone.
func (b *Ops) RemoveAll(ctx context.Context, family rules.Family) (removed int, err error) {
	return b.cleanup(ctx, family, isOurs)
}

// CleanupPredecessor removes the chains of Kakao's network-node-manager (NMANAGER_*, any table) for
// which match is true (nil: all) and the rules jumping to them in family, leaving ours alone. It
// returns how many chains it removed (core.PredecessorCleaner).
func (b *Ops) CleanupPredecessor(ctx context.Context, family rules.Family, match func(chain string) bool) (int, error) {
	return b.cleanup(ctx, family, func(c string) bool {
		return strings.HasPrefix(c, PredecessorChainPrefix) && (match == nil || match(c))
	})
}

// RemoveFix deletes the NNM- chains of fix in every table of family (those the kernel says it owns:
// jumped to by its commented rules from the built-in chains, and what they reach), with every rule
// jumping to them, and returns how many it removed: the one fix's share of RemoveAll, once the
// nftables backend has that fix's replacement in (backends.Leftovers).
func (b *Ops) RemoveFix(ctx context.Context, family rules.Family, fix string) (removed int, err error) {
	return b.remove(ctx, family, isOurs, func(d *dump) map[tchain]bool { return d.owned(fix) })
}

func (b *Ops) cleanup(ctx context.Context, family rules.Family, match func(string) bool) (removed int, err error) {
	return b.remove(ctx, family, match, func(d *dump) map[tchain]bool { return removable(d, match) })
}

// remove deletes the chains pick chooses from family's dump (taken when it declares a chain whose
// name matches) and every rule jumping to them.
func (b *Ops) remove(ctx context.Context, family rules.Family, match func(string) bool, pick func(*dump) map[tchain]bool) (removed int, err error) {
	b.shared.Lock()
	defer b.shared.Unlock()
	d, err := b.dumpDeclaring(ctx, family, match)
	if err != nil || d == nil {
		return 0, err
	}
	gone := pick(d)
	p := plan{}
	removeChains(p, d, gone, nil)
	if p.commits("") > 0 { // removals only: never split, no loading chain
		if err := b.restore(ctx, family, "", p); err != nil {
			return 0, fmt.Errorf("cleanup (%s): %w", family, err)
		}
		b.log.Info("chains cleaned up", "family", family, "chains", len(gone))
	}
	return len(gone), nil
}

// save runs iptables-save -c for all tables of family and parses its output as it arrives.
func (b *Ops) save(ctx context.Context, family rules.Family) (*dump, error) {
	bin := b.Binary(family, "save")
	p := newSaveParser()
	stderr, err := b.runSave(ctx, bin, p)
	if err != nil {
		return nil, fmt.Errorf("%s -c: %w: %s", bin, err, strings.TrimSpace(string(stderr)))
	}
	d, err := p.finish()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	b.noteUnparsed(bin, d)
	return d, nil
}

// noteUnparsed logs the lines of a dump that could not be parsed (foreign ones: ours always parse),
// once per binary until they change.
func (b *Ops) noteUnparsed(bin string, d *dump) {
	b.umu.Lock()
	defer b.umu.Unlock()
	if b.unparsed == nil {
		b.unparsed = map[string]string{}
	}
	if b.unparsed[bin] == d.firstUnparsed {
		return
	}
	b.unparsed[bin] = d.firstUnparsed
	if d.unparsed > 0 {
		b.log.Warn("lines of iptables-save that cannot be parsed are left out (they are not ours; our rules are still found)", "binary", bin, "lines", d.unparsed, "first", d.firstUnparsed)
	}
}

// dumpDeclaring returns iptables-save's dump of family if it declares a chain whose name matches,
// else nil. The common case (the predecessor's takeover once at start, next to 100,000 rules of
// ours at 50,000 Services) is decided by one iptables-save whose output is scanned line by line as
// it arrives, holding one line: held whole, that output was 20-25 MB at 50,000 Services, and the
// largest live heap of the agent's run. Only when a chain matches is the dump taken again, parsed as
// it arrives like any save (the rule removal needs every jump to the chains): held whole first, it
// was most of `cleanup --dry-run`'s memory beside the agent it runs in (below).
func (b *Ops) dumpDeclaring(ctx context.Context, family rules.Family, match func(string) bool) (*dump, error) {
	bin := b.Binary(family, "save")
	scan := newDeclScanner(match)
	if stderr, err := b.runSave(ctx, bin, scan); err != nil {
		return nil, fmt.Errorf("%s -c: %w: %s", bin, err, strings.TrimSpace(string(stderr)))
	}
	if !scan.found {
		return nil, nil
	}
	return b.save(ctx, family)
}

// runSave runs bin (an iptables-save) with -c, its output written to w (runTool).
func (b *Ops) runSave(ctx context.Context, bin string, w io.Writer) ([]byte, error) {
	return b.runTool(ctx, bin, []string{"-c"}, nil, w)
}

// runTool runs bin (an iptables-save or iptables-restore) when no other of the agent process is
// running (toolslot: each holds a family's tables in its own memory, charged to the agent's cgroup).
func (b *Ops) runTool(ctx context.Context, bin string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	release, err := toolslot.Acquire(ctx, bin)
	if err != nil {
		return nil, err
	}
	defer release()
	return b.run.Run(ctx, bin, args, stdin, stdout)
}

// declScanner is written iptables-save output and reports whether it declares a chain
// (":NAME POLICY [p:b]") whose name matches, holding only the line being written.
type declScanner struct {
	lineWriter
	found bool
}

func newDeclScanner(match func(string) bool) *declScanner {
	s := &declScanner{}
	s.each = func(line []byte) {
		if !s.found && len(line) > 1 && line[0] == ':' {
			name, _, _ := bytes.Cut(line[1:], []byte(" "))
			s.found = match(string(bytes.TrimSpace(name)))
		}
	}
	return s
}

// list runs iptables -S CHAIN: the chain's rules in iptables-save's format, without reading the
// rest of the kernel's rules into text.
func (b *Ops) list(ctx context.Context, family rules.Family, table, chain string) ([]*savedRule, error) {
	bin := b.Binary(family, "")
	args := []string{"-w", strconv.Itoa(b.lockWait), "-t", table, "-S", chain}
	var out strings.Builder
	stderr, err := b.run.Run(ctx, bin, args, nil, &out)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(stderr)))
	}
	return parseList(chain, out.String())
}

var lineNo = regexp.MustCompile(`line:? (\d+)`)

// restore feeds p to iptables-restore --noflush, one transaction per table, rendered as it is sent;
// a plan of more rules in a table than plan.bound goes in several restores (plan.chunks), so
// that no iptables-restore holds a batch of tens of thousands of rules. The error names the tool's
// message and the input line it complains about; one that names a line is a refusal of the content
// (backend.ErrRejected). A failed restore changed nothing, but the restores before it of the same
// plan (whole chains, reached from the fix's loading chain only if new) stay.
func (b *Ops) restore(ctx context.Context, family rules.Family, fix string, p plan, extra ...string) error {
	if len(extra) > 0 { // --test: the later chunks would name chains only the earlier ones make
		return b.restoreOne(ctx, family, p, extra...)
	}
	for _, c := range p.chunks(p.bound(), fix) {
		if err := b.restoreOne(ctx, family, c); err != nil {
			return err
		}
	}
	return nil
}

func (b *Ops) restoreOne(ctx context.Context, family rules.Family, p plan, extra ...string) error {
	bin := b.Binary(family, "restore")
	args := append([]string{"-w", strconv.Itoa(b.lockWait), "--noflush"}, extra...)
	run := b.run.Run
	if b.variant == NFT {
		// iptables-nft-restore fetches the tables it changes into its own memory first, so it takes
		// the slot like a save. It takes no xtables lock (-w is accepted and ignored), so it cannot be
		// held up by another process with the slot taken; iptables-legacy-restore may wait up to
		// lockWait for that lock, and holding the slot meanwhile would stop every read of the agent
		// (TestKernelBlockedUnitDelaysNoOther).
		run = b.runTool
	}
	stderr, err := run(ctx, bin, args, p.reader(), nil)
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(string(stderr))
	m := lineNo.FindStringSubmatch(msg)
	if m != nil {
		n, _ := strconv.Atoi(m[1])
		if lines := strings.Split(p.String(), "\n"); n >= 1 && n <= len(lines) {
			msg += fmt.Sprintf(" (input line %d: %s)", n, lines[n-1])
		}
	}
	err = fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args[2:], " "), err, msg)
	if m != nil && ctx.Err() == nil {
		return rejected{err}
	}
	return err
}

// rejected is an error of iptables-restore that names an input line: the content was refused.
type rejected struct{ error }

func (e rejected) Unwrap() []error { return []error{e.error, backend.ErrRejected} }

// Check is part of backend.Ops: iptables-restore --test with the input that programs rs on a
// kernel that holds none of it (what Render shows), committing nothing.
func (b *Ops) Check(ctx context.Context, u backend.Unit, rs *rules.Ruleset) error {
	if err := rs.Validate(); err != nil {
		return err
	}
	p, _, _, err := planRuleset(rs)
	if err != nil {
		return err
	}
	return b.restore(ctx, u.Family, u.Fix, p, "--test")
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
