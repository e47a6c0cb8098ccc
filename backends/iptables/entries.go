package iptables

import (
	"context"
	"hash/maphash"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// The record keeps digests of chain contents instead of their text. maphash with one seed per
// process: records never outlive the process, and a collision between two renderings of one chain
// (2^-64) is the only way a change could be missed.
var digestSeed = maphash.MakeSeed()

func newDigest() *maphash.Hash {
	h := &maphash.Hash{}
	h.SetSeed(digestSeed)
	return h
}

// digest is the digest of the chain's rendered rules (what decides whether it must be rewritten).
func (c *rchain) digest() uint64 {
	h := newDigest()
	for _, l := range c.lines {
		h.WriteString(l)
		h.WriteByte('\n')
	}
	return h.Sum64()
}

// applyEntries is Reconcile's way for a ruleset that differs from the record only in map entries
// (the common case: one Service changes among thousands). It renders only the buckets where the old
// and the new ruleset differ (scope.only), with every bucket named as the whole ruleset names it; when
// no bucket appears or goes (bucketsKept) and none of them is inlined nothing else, else also the
// dispatching chains in full (their rules depend on which buckets exist, and hold the inlined
// buckets' rules: renderChange renders those buckets' entries too). So the rendering follows the change, not the
// number of entries: at 10,000 entries one such change allocates 1.2 MB instead of 3.3 MB
// (BenchmarkApply10k one-entry-ipv4). With one iptables-restore it rewrites what differs from the
// record, adds buckets that appear and deletes buckets that disappear. When exact (the generation
// shows the kernel still is the record) and only existing buckets change, they are edited in place
// instead of rewritten: their rules that go are deleted and those that come are inserted at their
// positions (bucketEdit), which costs iptables-nft-restore half of a 500-rule bucket's rewrite. It
// returns false without having changed anything when the record does not match the old rendering,
// and backend.ErrStale when the restore failed.
func (b *Ops) applyEntries(ctx context.Context, from, rs *rules.Ruleset, prev *record, exact bool) (backend.Step[*record], error) {
	var no backend.Step[*record] // not this way: nothing changed
	touched := changedBuckets(from, rs)
	if touched == nil {
		return backend.Step[*record]{Done: true, Rec: prev}, nil
	}
	oldChains, newChains, kept, ok := renderChange(from, rs, touched, prev)
	if !ok {
		return no, nil
	}
	// complete: a chain whose rules the scope renders in full.
	complete := func(c *rchain) bool { return c.parent == "" || c.node || touched[c.lookup][c.prefix] }
	was := map[tchain]*rchain{}
	for _, c := range oldChains {
		k := c.key()
		was[k] = c
		d, ok := prev.content[k]
		if !ok || (complete(c) && d != c.digest()) {
			return no, nil // the record is not what the old ruleset renders
		}
	}
	content := make(map[tchain]uint64, len(prev.content))
	for k, v := range prev.content {
		content[k] = v
	}
	chains := make(map[tchain]bool, len(prev.chains))
	for k := range prev.chains {
		chains[k] = true
	}
	parent := make(map[tchain]string, len(prev.parent))
	for k, v := range prev.parent {
		parent[k] = v
	}
	var changed []*rchain
	edits := map[tchain]edit{}
	now := map[tchain]bool{}
	for _, c := range newChains {
		k := c.key()
		now[k] = true
		if !complete(c) {
			if !prev.chains[k] {
				return no, nil // an untouched bucket cannot appear
			}
			continue
		}
		d := c.digest()
		if old, ok := prev.content[k]; ok && old == d {
			continue
		}
		if !prev.chains[k] && c.parent == "" {
			return no, nil // a new chain that is not a bucket: applyChanged checks ownership
		}
		changed = append(changed, c)
		if o := was[k]; exact && o != nil && c.parent != "" {
			if e, ok := bucketEdit(o.lines, c.lines, c.unordered); ok {
				edits[k] = e
			}
		}
		content[k], chains[k] = d, true
		if c.parent != "" {
			parent[k] = c.parent
		}
	}
	stale, ok := staleChains(now, prev, kept)
	if !ok {
		return no, nil
	}
	for _, k := range stale {
		delete(content, k)
		delete(chains, k)
		delete(parent, k)
	}
	if len(changed) == 0 && len(stale) == 0 {
		return backend.Step[*record]{Done: true, Rec: prev}, nil
	}
	if len(stale) > 0 || len(edits) != len(changed) {
		// A restore that also declares, flushes or deletes a chain and edits another took
		// iptables-nft-restore 188-254 ms at 10,000 entries instead of 20-45: all chains are
		// then rewritten.
		clear(edits)
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].name < changed[j].name })
	sort.Slice(stale, func(i, j int) bool { return stale[i].String() < stale[j].String() })
	nrec := &record{content: content, parent: parent, jumps: prev.jumps, chains: chains, counters: prev.counters, precede: prev.precede}
	return b.rewriteChains(ctx, rs, changed, edits, stale, drainable(stale, was, newChains), prev, nrec)
}

// drainable are the stale chains whose rules all go: buckets (was: the old ruleset's rendered
// buckets) whose map prefix no bucket of the new ruleset has. A stale bucket whose prefix is still
// wanted moved to another chain (an IPv6 bucket renamed when a colliding prefix came or went:
// bucketNameTry) and holds entries that stay until that chain is filled.
func drainable(stale []tchain, was map[tchain]*rchain, now []*rchain) []tchain {
	wanted := map[string]map[netip.Prefix]bool{}
	want := func(c *rchain) {
		if wanted[c.lookup] == nil {
			wanted[c.lookup] = map[netip.Prefix]bool{}
		}
		wanted[c.lookup][c.prefix] = true
	}
	for _, c := range now {
		if c.parent != "" && !c.node {
			want(c)
		}
		for _, h := range c.holds { // inlined: its rule moved into c
			want(h)
		}
	}
	var out []tchain
	for _, k := range stale {
		if c := was[k]; c != nil && c.parent != "" && !c.node && !wanted[c.lookup][c.prefix] {
			out = append(out, k)
		}
	}
	return out
}

// renderChange renders the chains of from and of rs that a change of the touched buckets' entries
// may change. Of from, that is the touched buckets it has as chains (not inlined), their parents
// taken from the record. When no bucket appears or goes (kept, bucketsKept: a Service changes among
// thousands whose buckets stay) and no touched bucket is or becomes inlined, the dispatching chains
// stay as they are and of rs too only the touched buckets are rendered; otherwise rs's dispatching
// chains are rendered in full, with the rules of the buckets they inline (the touched ones, and
// those the record has no chain for: scope.recorded), and its other buckets empty
// (the record, not a second full rendering of from, then says which chains go: staleChains; that
// rendering was half the Go time of such a change). It returns false when a rendering fails (the
// full rendering reports why) or a bucket it kept is not in the record.
func renderChange(from, rs *rules.Ruleset, touched map[string]map[netip.Prefix]bool, prev *record) (old, now []*rchain, kept, ok bool) {
	sc := scope{only: touched, bucketsOnly: bucketsKept(from, rs, touched), recorded: prev.chains}
	old, _, err := renderChains(from, scope{only: touched, bucketsOnly: true})
	if err != nil {
		return nil, nil, false, false
	}
	if now, _, err = renderChains(rs, sc); err != nil {
		return nil, nil, false, false
	}
	if sc.bucketsOnly && (slices.ContainsFunc(old, (*rchain).inlined) || slices.ContainsFunc(now, (*rchain).inlined)) {
		// An inlined bucket's rule stands in the chain that lists it: render that chain too.
		sc.bucketsOnly = false
		if now, _, err = renderChains(rs, sc); err != nil {
			return nil, nil, false, false
		}
	}
	old = slices.DeleteFunc(old, (*rchain).inlined) // the record has no chain of theirs
	recorded := old
	if sc.bucketsOnly {
		recorded = slices.Concat(old, now)
	}
	for _, c := range recorded {
		if !prev.chains[c.key()] {
			return nil, nil, false, false
		}
		c.parent = prev.parent[c.key()]
	}
	return old, now, sc.bucketsOnly, true
}

// staleChains returns the chains of the record that a change of entries removes: none when buckets
// were kept (bucketsKept: every touched bucket is in both rulesets or in neither); otherwise every
// chain of the record that now (rs's chains in full) does not have, which must be a bucket or a node
// of a dispatch tree (false otherwise: not a change of entries).
func staleChains(now map[tchain]bool, prev *record, kept bool) (stale []tchain, ok bool) {
	if kept {
		return nil, true
	}
	for k := range prev.chains {
		if !now[k] {
			if prev.parent[k] == "" {
				return nil, false
			}
			stale = append(stale, k)
		}
	}
	return stale, true
}

// edit turns a chain's rules into others in place: deletes ("-D CHAIN spec", each of a rule that is
// there) first, then inserts ("-I CHAIN n spec", at ascending final positions, or "-A CHAIN spec").
type edit struct{ deletes, inserts []string }

// bucketEdit returns the edit that turns the rules old into now (both "-A CHAIN spec" lines of one
// chain), or false when a rewrite is the better way: a line occurs twice (a delete by spec would be
// ambiguous), the rules that stay change their order, or the edit would touch more than half of now.
// Deleting what goes leaves the rules that stay, in now's order; inserting each new rule at its index
// in now, lowest first, then yields now exactly. In an unordered chain (rchain.unordered) the new
// rules are appended instead: iptables-nft then needs no listing of the chain to place them (with
// 10,000 rules reachable from the hooks, 11-15 ms from the process's start to the commit against
// 14-17 ms for an insert at a position), and the chain holds now's rules in another order.
func bucketEdit(old, now []string, unordered bool) (edit, bool) {
	var e edit
	inOld := make(map[string]bool, len(old))
	for _, l := range old {
		if inOld[l] {
			return e, false
		}
		inOld[l] = true
	}
	inNow := make(map[string]bool, len(now))
	for _, l := range now {
		if inNow[l] {
			return e, false
		}
		inNow[l] = true
	}
	var kept []string
	for _, l := range old {
		if inNow[l] {
			kept = append(kept, l)
		} else {
			e.deletes = append(e.deletes, "-D "+strings.TrimPrefix(l, "-A "))
		}
	}
	j := 0
	for i, l := range now {
		if inOld[l] {
			if !unordered && kept[j] != l {
				return e, false
			}
			j++
			continue
		}
		if unordered {
			e.inserts = append(e.inserts, l)
			continue
		}
		chain, spec, _ := strings.Cut(strings.TrimPrefix(l, "-A "), " ")
		e.inserts = append(e.inserts, "-I "+chain+" "+strconv.Itoa(i+1)+" "+spec)
	}
	if 2*(len(e.deletes)+len(e.inserts)) > len(now) {
		return e, false
	}
	return e, true
}

// changedBuckets returns, per map name, the bucket prefixes where old and now (same chains) differ
// in entries, or nil when no entry differs.
func changedBuckets(old, now *rules.Ruleset) map[string]map[netip.Prefix]bool {
	var touched map[string]map[netip.Prefix]bool
	for i := range now.Maps {
		name := now.Maps[i].Name
		touch := func(e rules.MapEntry) {
			if touched == nil {
				touched = map[string]map[netip.Prefix]bool{}
			}
			if touched[name] == nil {
				touched[name] = map[netip.Prefix]bool{}
			}
			touched[name][bucketPrefix(e.Addr)] = true
		}
		// A changed entry keeps its key, so its address and bucket.
		rules.DiffEntries(old.Maps[i].Sorted(), now.Maps[i].Sorted(), touch, touch, func(was, _ rules.MapEntry) { touch(was) })
	}
	return touched
}

// bucketEntries is the entries of sorted (sorted by address) in bucket p: a sub-slice.
func bucketEntries(sorted []rules.MapEntry, p netip.Prefix) []rules.MapEntry {
	i := sort.Search(len(sorted), func(i int) bool { return !sorted[i].Addr.Less(p.Addr()) })
	j := i
	for j < len(sorted) && p.Contains(sorted[j].Addr) {
		j++
	}
	return sorted[i:j]
}

// bucketsKept reports whether from and rs (the same chains; their maps differ in the touched buckets'
// entries only) have the same lookup buckets: each touched bucket of each lookup run exists in both
// or in neither.
func bucketsKept(from, rs *rules.Ruleset, touched map[string]map[netip.Prefix]bool) bool {
	for _, c := range rs.Chains {
		for first := 0; first < len(c.Rules); {
			end := runEnd(c, first)
			if lookup := c.Rules[first].Match.Lookup; bucketed(c.Rules[first].Match) {
				for p := range touched[lookup] {
					if hasBucket(from, c.Rules[first:end], p) != hasBucket(rs, c.Rules[first:end], p) {
						return false
					}
				}
			}
			first = end
		}
	}
	return true
}

// hasBucket reports whether the lookup run run (rules of one map) expands an entry of rs in bucket p.
func hasBucket(rs *rules.Ruleset, run []rules.Rule, p netip.Prefix) bool {
	m := rs.Map(run[0].Match.Lookup)
	if m == nil {
		return false
	}
	for _, e := range bucketEntries(m.Sorted(), p) {
		for _, r := range run {
			if expands(r.Match, &e) {
				return true
			}
		}
	}
	return false
}
