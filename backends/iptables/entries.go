package iptables

import (
	"context"
	"hash/maphash"
	"net/netip"
	"sort"

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

// applyEntries is Reconcile's way for a ruleset that differs from the record only in map entries,
// when every entry added, removed or changed falls into a lookup bucket that exists before and after
// (the common case: one Service changes among thousands). It renders only the buckets of the changed
// entries, from the old and the new ruleset, and rewrites those whose rules differ, with one
// iptables-restore; nothing else is rendered, so the cost follows the change, not the number of
// entries. It returns false without having changed anything when a bucket appears or disappears
// (the dispatching chain changes too: applyChanged's way) or when the record does not match the old
// rendering; errShortWay when the restore failed.
func (b *Backend) applyEntries(ctx context.Context, rs *rules.Ruleset, prev *record, g0 uint32, genOK bool) (bool, error) {
	was, now := changedBuckets(prev.rs, rs)
	if was == nil {
		prev.rs = rs.Clone()
		return false, nil
	}
	oldChains, _, err := renderChains(was)
	if err != nil {
		return false, nil
	}
	newChains, _, err := renderChains(now)
	if err != nil {
		return false, nil // the full rendering reports it
	}
	oldBuckets, newBuckets := buckets(oldChains), buckets(newChains)
	if len(oldBuckets) != len(newBuckets) {
		return false, nil
	}
	var changed []*rchain
	for k, c := range newBuckets {
		o := oldBuckets[k]
		if o == nil || prev.content[k] != o.digest() {
			return false, nil
		}
		if d := c.digest(); d != prev.content[k] {
			changed = append(changed, c)
		}
	}
	if len(changed) == 0 {
		return false, nil
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].name < changed[j].name })
	content := make(map[tchain]uint64, len(prev.content))
	for k, v := range prev.content {
		content[k] = v
	}
	for _, c := range changed {
		content[c.key()] = c.digest()
	}
	nrec := &record{rs: rs.Clone(), content: content, parent: prev.parent, jumps: prev.jumps, chains: prev.chains, counters: prev.counters}
	return b.rewriteChains(ctx, rs, changed, nil, prev, nrec, g0, genOK)
}

// buckets are the lookup buckets among chains.
func buckets(chains []*rchain) map[tchain]*rchain {
	out := map[tchain]*rchain{}
	for _, c := range chains {
		if c.parent != "" {
			out[c.key()] = c
		}
	}
	return out
}

// changedBuckets returns old and now (same chains, different map entries) with every map narrowed
// to the entries in the buckets where the two differ, or nil, nil when no entry differs.
func changedBuckets(old, now *rules.Ruleset) (*rules.Ruleset, *rules.Ruleset) {
	touched := make([]map[netip.Prefix]bool, len(now.Maps))
	any := false
	for i := range now.Maps {
		a, z := old.Maps[i].Sorted(), now.Maps[i].Sorted()
		for len(a) > 0 || len(z) > 0 {
			var c int
			switch {
			case len(a) == 0:
				c = 1
			case len(z) == 0:
				c = -1
			default:
				c = rules.CompareEntries(&a[0], &z[0])
			}
			var p netip.Prefix
			switch {
			case c < 0:
				p, a = bucketPrefix(a[0].Addr), a[1:]
			case c > 0:
				p, z = bucketPrefix(z[0].Addr), z[1:]
			default:
				same := a[0] == z[0]
				p, a, z = bucketPrefix(a[0].Addr), a[1:], z[1:]
				if same {
					continue
				}
			}
			if touched[i] == nil {
				touched[i] = map[netip.Prefix]bool{}
			}
			touched[i][p] = true
			any = true
		}
	}
	if !any {
		return nil, nil
	}
	narrow := func(rs *rules.Ruleset) *rules.Ruleset {
		out := *rs
		out.Maps = make([]rules.Map, len(rs.Maps))
		for i := range rs.Maps {
			out.Maps[i].Name = rs.Maps[i].Name
			for _, e := range rs.Maps[i].Sorted() {
				if touched[i][bucketPrefix(e.Addr)] {
					out.Maps[i].Entries = append(out.Maps[i].Entries, e)
				}
			}
		}
		return &out
	}
	return narrow(old), narrow(now)
}
