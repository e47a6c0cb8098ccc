package iptables

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// MaxRestoreRules bounds the rules one iptables-restore process is given. iptables-nft-restore
// holds the whole batch of a table in memory until it commits, about 2.5 KB per rule: at 10,000
// map entries (20,000-40,000 rules) one restore took 50-99 MB, charged to the agent's memory cgroup
// beside the agent itself, and the DaemonSet's 128Mi limit OOM-killed it (issue #38; measured with
// `go run ./bench -manifest`, whose agent runs in a memory cgroup with the DaemonSet's limit). A
// split costs far more than a process start: the cold start of 10,000 entries (10,004 rules and
// ~800 of dispatch) took 391-401 ms in two restores a family and 242-266 ms in one, against a floor
// of 264-289 ms (`go run ./bench -n 10000 -runs 1 -changes 20 -idle 5s -floor-runs 3 -backends
// iptables`, two runs each, interleaved). 12,000 makes such a cold start one restore; with it the
// cold start of `go run ./bench -hostile 4x30000,12x5000 -manifest -backends iptables` peaked at
// 78.5 MiB of the agent's cgroup, against 82-84 MiB split.
const MaxRestoreRules = 12000

// MaxDrainingRestoreRules bounds a restore of a plan that drains chains (buckets no longer wanted
// whose rules all go): split at this bound, the drains are emptied in the first restore, so the
// kernel does not hold the old rules and their replacements at once. The hostile Services moving to
// other addresses peaked at 96.4 MiB of the agent's cgroup (24.7 % spare, under the 25 % wanted) in
// one restore of 12,000, at 91.9 MiB (28 %) split at 5,000.
const MaxDrainingRestoreRules = 5000

// bound is the most rules a restore of p appends to a table: MaxDrainingRestoreRules when p drains
// chains, else MaxRestoreRules.
func (p plan) bound() int {
	for _, o := range p {
		if len(o.drains) > 0 {
			return MaxDrainingRestoreRules
		}
	}
	return MaxRestoreRules
}

// chunks splits p, a plan of fix, into restores of at most max appended rules per table (and a jump
// per chain they declare, below), run in order: first whole chains (declared, so created or flushed,
// and filled in the same restore, so that each chain changes at once), a chain after every chain of
// the plan its rules jump to, then one restore with what is left: the appends to chains the plan
// does not declare, the deletes, flushes, removals and the jumps from the built-in chains. A new
// chain therefore is unreferenced from the built-in chains until the last restore makes the fix's
// jumps (the last chains go in that restore when they and what is left fit in one); a chain the
// kernel already holds is rewritten whole, but not at the same moment as the other chains of the
// fix. The chains that go and whose rules all go too (drains: buckets no longer
// wanted) are emptied in the first restore, so that the kernel does not hold their rules and their
// replacements' at once (a tenant's Services moving 10,000 entries to other addresses took the
// kernel memory of the agent's cgroup from 16.8 to 29 MiB). A plan with at most max appends per
// table is one restore, as before.
//
// So that a run stopped between those restores (a kill, a failed restore) leaves nothing that is not
// known to be the fix's, each split table's first restore also makes the fix's loading chain
// (loadingChain), which jumps, commented as the fix's, to every chain the plan removes, and each
// restore adds a jump to every chain it declares; dump.owners counts the chains reached from it as
// the fix's, so the next apply of the fix, or a cleanup, removes them. The loading chain is never
// jumped to (no packet passes it), and the last restore removes it.
func (p plan) chunks(max int, fix string) []plan {
	big := false
	for _, o := range p {
		if len(o.appends) > max {
			big = true
		}
	}
	if !big {
		return []plan{p}
	}
	var early []plan
	last := plan{}
	for _, t := range p.tables() {
		o := p[t]
		if len(o.appends) <= max {
			last[t] = o
			continue
		}
		declared := make(map[string]bool, len(o.decls))
		for _, c := range o.decls {
			declared[c] = true
		}
		lines := map[string][]string{} // a declared chain's appends, in order
		rest := &tableOps{deletes: o.deletes, flushes: o.flushes, removes: o.removes, inserts: o.inserts}
		for _, l := range o.appends {
			if c := appendChain(l); declared[c] {
				lines[c] = append(lines[c], l)
			} else {
				rest.appends = append(rest.appends, l)
			}
		}
		// Leaf first: a chain after the declared chains it jumps to (depth first, in declaration order).
		order := make([]string, 0, len(o.decls))
		state := map[string]int{} // 1: being visited, 2: done
		var visit func(c string)
		visit = func(c string) {
			if state[c] != 0 {
				return // done, or a cycle (which the kernel refuses anyway)
			}
			state[c] = 1
			for _, l := range lines[c] {
				if t := jumpTarget(l); declared[t] {
					visit(t)
				}
			}
			state[c] = 2
			order = append(order, c)
		}
		for _, c := range o.decls {
			visit(c)
		}
		loading := loadingChain(fix)
		hold := func(o *tableOps, c string) {
			if c != loading {
				o.appends = append(o.appends, "-A "+loading+" "+jumpSpec(fix, c))
			}
		}
		cur := &tableOps{decls: []string{loading}}
		for _, c := range o.removes {
			hold(cur, c)
			if slices.Contains(o.drains, c) {
				cur.flushes = append(cur.flushes, c)
			}
		}
		flush := func() {
			for _, c := range cur.decls {
				hold(cur, c)
			}
			early = append(early, plan{t: cur})
			cur = &tableOps{}
		}
		first := len(early)
		for _, c := range order {
			if len(cur.appends) > 0 && len(cur.appends)+len(lines[c]) > max {
				flush()
			}
			cur.decls = append(cur.decls, c)
			cur.appends = append(cur.appends, lines[c]...)
		}
		if len(early) > first && len(cur.appends)+len(rest.appends) <= max {
			// The last chains go with what is left when both fit: one process and commit fewer.
			rest.decls, rest.appends = cur.decls, append(cur.appends, rest.appends...)
		} else {
			flush()
		}
		if !slices.Contains(rest.removes, loading) {
			rest.flushes = append(rest.flushes, loading)
			rest.removes = append(rest.removes, loading)
		}
		last[t] = rest
	}
	if len(last) > 0 {
		early = append(early, last)
	}
	return early
}

// loadingChainPrefix + a digest of the fix id names the fix's loading chain (plan.chunks).
const loadingChainPrefix = ChainPrefix + "LOADING-"

// loadingChain is the name of fix's loading chain: 24 characters, within the kernel's 28, whatever
// the fix id's length.
func loadingChain(fix string) string {
	h := sha256.Sum256([]byte(fix))
	return loadingChainPrefix + strings.ToUpper(hex.EncodeToString(h[:6]))
}

func isLoading(chain string) bool { return strings.HasPrefix(chain, loadingChainPrefix) }

// appendChain is the chain of an "-A <chain> ..." line.
func appendChain(l string) string {
	rest, ok := strings.CutPrefix(l, "-A ")
	if !ok {
		return ""
	}
	c, _, _ := strings.Cut(rest, " ")
	return c
}

// jumpTarget is the chain or target of a rule line's -j or -g ("" if none).
func jumpTarget(l string) string {
	for _, flag := range []string{" -j ", " -g ", " --jump ", " --goto "} {
		if i := strings.LastIndex(l, flag); i >= 0 {
			t, _, _ := strings.Cut(l[i+len(flag):], " ")
			return t
		}
	}
	return ""
}
