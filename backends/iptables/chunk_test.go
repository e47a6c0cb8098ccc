package iptables

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

// A plan larger than the bound goes in restores of whole chains, each after the chains it jumps
// to, and the jumps from the built-in chains, deletes and removals come last: nothing is lost,
// nothing is in two restores.
func TestPlanChunks(t *testing.T) {
	p := plan{}
	nat := p.table("nat")
	nat.decls = append(nat.decls, "TOP")
	for b := range 5 {
		bucket := fmt.Sprintf("B%d", b)
		nat.appends = append(nat.appends, fmt.Sprintf("-A TOP -d 10.%d.0.0/16 -m comment --comment \"a -j X\" -j %s", b, bucket))
	}
	for b := range 5 {
		bucket := fmt.Sprintf("B%d", b)
		nat.decls = append(nat.decls, bucket)
		for i := range 4 {
			nat.appends = append(nat.appends, fmt.Sprintf("-A %s -d 10.%d.0.%d/32 -j DNAT --to-destination 10.96.0.1:80", bucket, b, i))
		}
	}
	nat.appends = append(nat.appends, "-A FOREIGN -j RETURN") // a chain the plan does not declare
	nat.deletes = []string{"-D OLD -j X"}
	nat.flushes, nat.removes = []string{"STALE", "GONE"}, []string{"STALE", "GONE"}
	nat.drains = []string{"GONE"} // its rules all go: emptied in the first restore
	nat.inserts = []string{"-I PREROUTING 1 -j TOP"}
	p.table("mangle").appends = []string{"-A M -j RETURN"}

	if got := p.chunks(100, "fx"); len(got) != 1 {
		t.Fatalf("a plan under the bound is %d restores, want 1", len(got))
	} else if undrained := *nat; true {
		undrained.drains = nil
		if want := (plan{"nat": &undrained, "mangle": p["mangle"]}).String(); got[0].String() != want {
			t.Errorf("a plan of one restore renders its drains:\n%s\nwant\n%s", got[0], want)
		}
	}
	const max = 9
	cs := p.chunks(max, "fx")
	if len(cs) < 3 {
		t.Fatalf("%d restores, want several", len(cs))
	}
	loading := loadingChain("fx")
	made := map[string]int{} // chain → restore that declares it
	var all []string
	for i, c := range cs {
		for tn, o := range c {
			appends := checkLoading(t, i, i == len(cs)-1, tn, o, nat.removes, loading)
			o := &tableOps{decls: slices.DeleteFunc(slices.Clone(o.decls), func(c string) bool { return c == loading }), appends: appends,
				deletes: o.deletes, flushes: o.flushes, removes: o.removes, inserts: o.inserts}
			if len(o.appends) > max {
				t.Errorf("restore %d, table %s: %d appends, more than %d", i, tn, len(o.appends), max)
			}
			early := o.flushes
			if i == 0 {
				if !slices.Equal(o.flushes, nat.drains) {
					t.Errorf("the first restore flushes %v, want the drains %v", o.flushes, nat.drains)
				}
				early = nil
			}
			if i < len(cs)-1 && (len(o.deletes)+len(early)+len(o.removes)+len(o.inserts) > 0 || tn == "mangle") {
				t.Errorf("restore %d of %d has deletes, removals, jumps or a small table: %+v", i, len(cs), o)
			}
			for _, d := range o.decls {
				if _, ok := made[d]; ok {
					t.Errorf("chain %s declared twice", d)
				}
				made[d] = i
			}
			all = append(all, o.appends...)
			for _, l := range o.appends {
				c := appendChain(l)
				if made[c] != i && slices.Contains(nat.decls, c) {
					t.Errorf("restore %d appends to %s, declared in restore %d", i, c, made[c])
				}
			}
		}
	}
	for _, l := range nat.appends {
		if tgt := jumpTarget(l); slices.Contains(nat.decls, tgt) && made[tgt] > made[appendChain(l)] {
			t.Errorf("%q: %s is made after %s", l, tgt, appendChain(l))
		}
	}
	want := append(slices.Clone(nat.appends), "-A M -j RETURN")
	slices.Sort(want)
	slices.Sort(all)
	if !slices.Equal(all, want) {
		t.Errorf("the restores append\n%v\nwant\n%v", all, want)
	}
	last := cs[len(cs)-1]
	withLoading := append(slices.Clone(nat.removes), loading)
	if l := last["nat"]; l == nil || !slices.Equal(l.inserts, nat.inserts) || !slices.Equal(l.deletes, nat.deletes) || !slices.Equal(l.removes, withLoading) || !slices.Equal(l.flushes, withLoading) ||
		!slices.Equal(slices.DeleteFunc(slices.Clone(l.appends), func(a string) bool { return slices.Contains(l.decls, appendChain(a)) }), []string{"-A FOREIGN -j RETURN"}) {
		t.Errorf("last restore %+v", last["nat"])
	}
	// The last chains go in the last restore when they fit with what is left (at 9: TOP's 5 jumps
	// and FOREIGN's rule), else in one of their own (at 5).
	for max, want := range map[int][]string{9: {"TOP"}, 5: nil} {
		cs := p.chunks(max, "fx")
		if got := cs[len(cs)-1]["nat"].decls; !slices.Equal(got, want) {
			t.Errorf("at %d rules a restore, the last restore declares %v, want %v", max, got, want)
		}
	}
	if got := p.commits("fx"); got != 2 { // under MaxRestoreRules: one restore, two tables
		t.Errorf("commits() = %d, want 2", got)
	}
}

// checkLoading checks the loading chain's rules in restore i's table tn (o): in the split nat table's
// restores but the last, a jump to every chain the restore declares, and in the first also to every
// chain the plan removes, which the first restore declares; none elsewhere. It returns the other
// appends.
func checkLoading(t *testing.T, i int, last bool, tn string, o *tableOps, removes []string, loading string) []string {
	t.Helper()
	var held []string
	var appends []string
	for _, l := range o.appends {
		if appendChain(l) == loading {
			if want := "-A " + loading + " " + jumpSpec("fx", jumpTarget(l)); l != want {
				t.Errorf("restore %d: loading chain rule %q, want %q", i, l, want)
			}
			held = append(held, jumpTarget(l))
		} else {
			appends = append(appends, l)
		}
	}
	if tn != "nat" || last {
		if len(held) > 0 {
			t.Errorf("restore %d (%s): loading chain rules %v", i, tn, held)
		}
		return appends
	}
	want := slices.DeleteFunc(slices.Clone(o.decls), func(c string) bool { return c == loading })
	if i == 0 {
		if !slices.Contains(o.decls, loading) {
			t.Errorf("restore 0 does not declare the loading chain: %v", o.decls)
		}
		want = append(slices.Clone(removes), want...)
	}
	slices.Sort(want)
	slices.Sort(held)
	if !slices.Equal(held, want) {
		t.Errorf("restore %d: the loading chain jumps to %v, want %v", i, held, want)
	}
	return appends
}

// drainable: of the stale chains, only buckets whose prefix no bucket of the new ruleset has; not
// a bucket whose prefix moved to another chain (an IPv6 bucket renamed by a collision), not a
// dispatch node, not a chain the old rendering does not know.
func TestDrainable(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	bucket := func(name, prefix string) *rchain {
		return &rchain{table: "nat", name: name, parent: "NNM-EXTIP-DNAT", lookup: "external-ips", prefix: p(prefix)}
	}
	gone, renamed := bucket("NNM-B-GONE", "fd00::10/124"), bucket("NNM-B-RENAMED", "fd00::20/124")
	node := &rchain{table: "nat", name: "NNM-T-NODE", parent: "NNM-EXTIP-DNAT", node: true}
	was := map[tchain]*rchain{gone.key(): gone, renamed.key(): renamed, node.key(): node}
	now := []*rchain{bucket("NNM-B-NEW", "fd00::20/124"), bucket("NNM-B-OTHER", "fd00::30/124"),
		{table: "nat", name: "NNM-B-OTHERMAP", parent: "NNM-X", lookup: "other-map", prefix: p("fd00::10/124")}}
	stale := []tchain{gone.key(), renamed.key(), node.key(), {"nat", "NNM-UNKNOWN"}}
	if got := drainable(stale, was, now); !slices.Equal(got, []tchain{gone.key()}) {
		t.Errorf("drainable = %v, want [%v]", got, gone.key())
	}
}

// A plan that drains chains is split at MaxDrainingRestoreRules, so that its drains are emptied in a
// restore before the replacements come; any other at MaxRestoreRules.
func TestPlanBound(t *testing.T) {
	p := plan{}
	p.table("nat").appends = []string{"-A B -j RETURN"}
	if got := p.bound(); got != MaxRestoreRules {
		t.Errorf("a plan without drains: bound %d, want %d", got, MaxRestoreRules)
	}
	p.table("mangle").drains = []string{"GONE"}
	if got := p.bound(); got != MaxDrainingRestoreRules || MaxDrainingRestoreRules >= MaxRestoreRules {
		t.Errorf("a plan that drains: bound %d, want %d (below %d)", got, MaxDrainingRestoreRules, MaxRestoreRules)
	}
}

// The pages that explain split loads quote the bounds as they are: this package's README and
// docs/deploy.md (its cleanup section).
func TestDocsQuoteRestoreBounds(t *testing.T) {
	thousands := func(n int) string { return fmt.Sprintf("%d,%03d", n/1000, n%1000) }
	for file, wants := range map[string][]string{
		"README.md":            {"`MaxRestoreRules` (" + thousands(MaxRestoreRules) + ")", "`MaxDrainingRestoreRules` (" + thousands(MaxDrainingRestoreRules) + ")"},
		"../../docs/deploy.md": {thousands(MaxRestoreRules) + " rules in a table, or " + thousands(MaxDrainingRestoreRules) + " in a change"},
	} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(data)), " ")
		for _, want := range wants {
			if !strings.Contains(text, want) {
				t.Errorf("%s does not say %q", file, want)
			}
		}
	}
}
