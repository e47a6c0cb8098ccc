package nftables

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestKernelForeignNNMTables (issue #41 row 10): tables named nnm-… that this backend did not make
// (without its owner comment, or with another comment) are someone else's: RemoveAll (what an
// iptables-backend agent runs at start, backends.Leftovers), CleanupPlan and Cleanup leave them
// byte-identical, and delete every table of ours, each of which carries the owner comment from its
// creation (with and without maps loaded over netlink). On main at d0ea2ac RemoveAll deleted
// `ip nnm-thirdparty-fw`.
func TestKernelForeignNNMTables(t *testing.T) {
	eachFamily(t, "nnm-own", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		nf := string(nftFamily(f))
		ns.MustExec("nft", "add table "+nf+" nnm-thirdparty-fw")
		ns.MustExec("nft", "add chain "+nf+" nnm-thirdparty-fw input { type filter hook input priority 0 ; }")
		ns.MustExec("nft", "add rule "+nf+" nnm-thirdparty-fw input tcp dport 22 counter accept comment \"network-node-manager:thirdparty\"")
		ns.MustExec("nft", "add table "+nf+" nnm-other { comment \"someone else's\" ; }")
		ns.MustExec("nft", "add table "+nf+" nnm-mimic { comment \"network-node-manager:invalid-drop\" ; }") // another table's marker
		foreignTables := func() string {
			return listTable(t, ns, f, "nnm-thirdparty-fw") + listTable(t, ns, f, "nnm-other") + listTable(t, ns, f, "nnm-mimic")
		}
		before := foreignTables()

		b := newRealKernel().backend(t)
		ext, inv := externalIPRuleset(f, threeEntries(f)), invalidDropRuleset(f)
		applyIn(ctx, t, ns, b, ext, inv)
		for _, fix := range []string{ext.Fix, inv.Fix} {
			if l := nftList(t, ns, "list", "table", nf, TableName(fix)); !strings.Contains(l, `comment "`+OwnerComment(fix)+`"`) {
				t.Errorf("table %s has no owner comment:\n%s", TableName(fix), l)
			}
		}
		inNS(t, ns, func() error {
			plan, err := opsOf(b).CleanupPlan(ctx)
			if err != nil {
				return err
			}
			text := strings.Join(plan, "\n")
			if strings.Contains(text, "thirdparty") || strings.Contains(text, "nnm-other") || strings.Contains(text, "nnm-mimic") || !strings.Contains(text, TableName(inv.Fix)) {
				t.Errorf("CleanupPlan = %q, want our tables only", text)
			}
			return nil
		})
		var removed int
		inNS(t, ns, func() (err error) { removed, err = opsOf(b).RemoveAll(ctx); return err })
		tables := nftList(t, ns, "list", "tables")
		if removed != 2 || strings.Contains(tables, TableName(ext.Fix)) || strings.Contains(tables, TableName(inv.Fix)) {
			t.Errorf("RemoveAll removed %d tables, left:\n%s", removed, tables)
		}
		if after := foreignTables(); after != before {
			t.Errorf("the foreign nnm- tables changed:\n%s\nwas:\n%s", after, before)
		}
		applyIn(ctx, t, ns, b, inv)
		inNS(t, ns, func() error { return b.Cleanup(ctx) })
		if after := foreignTables(); after != before {
			t.Errorf("Cleanup changed the foreign nnm- tables:\n%s\nwas:\n%s", after, before)
		}
		if tables := nftList(t, ns, "list", "tables"); strings.Contains(tables, TableName(inv.Fix)) {
			t.Errorf("Cleanup left our table:\n%s", tables)
		}
	})
}

// TestKernelSameNamedForeignTable (issue #63 row 1): a table named like one of ours, ip/ip6
// nnm-invalid-drop, that this backend did not make (no owner comment, a chain hooked at input at
// priority 0 with a rule of its own). At main 3f85643 the apply path found the table by its name:
// it deleted the foreign chain without a word and put its drop chains in that table, which cleanup,
// judging by the comment, then neither listed nor removed. Now the apply of the fix fails with a
// backend.ForeignError naming the table and changes nothing; removing the fix, CleanupPlan and
// Cleanup leave it byte-identical too.
func TestKernelSameNamedForeignTable(t *testing.T) {
	eachFamily(t, "nnm-samename", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		nf := string(nftFamily(f))
		inv := invalidDropRuleset(f)
		table := TableName(inv.Fix)
		ns.MustExec("nft", "add table "+nf+" "+table)
		ns.MustExec("nft", "add chain "+nf+" "+table+" input { type filter hook input priority 0 ; policy accept ; }")
		ns.MustExec("nft", "add rule "+nf+" "+table+" input tcp dport 22 counter accept")
		before := listTable(t, ns, f, table)

		b := newRealKernel().backend(t)
		var err error
		inNS(t, ns, func() error { err = apply(ctx, b, inv); return nil })
		var fe *backend.ForeignError
		if !errors.As(err, &fe) || !errors.Is(err, backend.ErrForeign) || fe.Object != "table "+nf+" "+table {
			t.Fatalf("apply into the foreign table: %v, want a ForeignError naming table %s %s", err, nf, table)
		}
		if after := listTable(t, ns, f, table); after != before {
			t.Errorf("the foreign table changed:\n%s\nwas:\n%s", after, before)
		}
		// A Verify pass (the periodic resync) is refused the same way.
		inNS(t, ns, func() error { _, err = b.Reconcile(ctx, inv.Fix, f, inv, backend.Verify); return nil })
		if !errors.Is(err, backend.ErrForeign) {
			t.Errorf("verify: %v, want ErrForeign", err)
		}
		inNS(t, ns, func() error {
			plan, err := opsOf(b).CleanupPlan(ctx)
			if err != nil {
				return err
			}
			if len(plan) != 0 {
				t.Errorf("CleanupPlan = %q, want nothing: the table is not ours", plan)
			}
			if err := remove(ctx, b, inv.Fix, f); err != nil {
				return err
			}
			return b.Cleanup(ctx)
		})
		if after := listTable(t, ns, f, table); after != before {
			t.Errorf("removing the fix or cleanup changed the foreign table:\n%s\nwas:\n%s", after, before)
		}
	})
}

// TestKernelEarlierVersionTableAdopted (issue #63 row 1): a table an agent made before the owner
// comment existed (b02826b) is the same table without a comment. It is adopted by the explicit rule
// of earlierVersion: CleanupPlan lists it (saying so) before any apply, and the apply rewrites it
// into exactly the table a cold apply makes, owner comment included, logging the adoption. At main
// 3f85643 CleanupPlan did not list it and the apply kept it without a comment, so an uninstall left
// its chains hooked.
func TestKernelEarlierVersionTableAdopted(t *testing.T) {
	eachFamily(t, "nnm-earlier", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		ext, inv := externalIPRuleset(f, threeEntries(f)), invalidDropRuleset(f)
		k := newRealKernel()
		var log strings.Builder
		k.log = &log
		b := k.backend(t)
		// The reference: what a cold apply makes, listed and removed again.
		applyIn(ctx, t, ns, b, ext, inv)
		want := listTable(t, ns, f, TableName(ext.Fix)) + listTable(t, ns, f, TableName(inv.Fix))
		inNS(t, ns, func() error { return b.Cleanup(ctx) })

		// An earlier version's tables: the same transactions without the table comment.
		for _, rs := range []*rules.Ruleset{ext, inv} {
			text, err := b.Render(rs)
			if err != nil {
				t.Fatal(err)
			}
			ns.NftLoad(ownerCommentLine.ReplaceAllString(text, "$1\n"))
		}
		inNS(t, ns, func() error {
			tables, err := listRealTables(ctx, nftFamily(f))
			for _, tb := range tables {
				if tb.Comment != "" {
					t.Fatalf("the earlier version's table %s has a comment: %q", tb.Name, tb.Comment)
				}
			}
			if len(tables) != 2 {
				t.Fatalf("tables %v, want the two earlier version's", tables)
			}
			return err
		})
		inNS(t, ns, func() error {
			plan, err := opsOf(b).CleanupPlan(ctx)
			if err != nil {
				return err
			}
			text := strings.Join(plan, "\n")
			for _, rs := range []*rules.Ruleset{ext, inv} {
				if !strings.Contains(text, TableName(rs.Fix)+" (made by an earlier version") {
					t.Errorf("CleanupPlan before the first apply = %q, want %s as an earlier version's", text, TableName(rs.Fix))
				}
			}
			return nil
		})

		b = k.backend(t) // a fresh agent: no record
		applyIn(ctx, t, ns, b, ext, inv)
		if got := listTable(t, ns, f, TableName(ext.Fix)) + listTable(t, ns, f, TableName(inv.Fix)); got != want {
			t.Errorf("the adopted tables:\n%s\nwant what a cold apply makes:\n%s", got, want)
		}
		if n := strings.Count(log.String(), "adopting a table an earlier version"); n != 2 {
			t.Errorf("%d adoptions logged, want 2:\n%s", n, log.String())
		}
		inNS(t, ns, func() error { return b.Cleanup(ctx) })
		if tables := nftList(t, ns, "list", "tables"); strings.Contains(tables, TablePrefix) {
			t.Errorf("cleanup left:\n%s", tables)
		}
	})
}

// ownerCommentLine matches an `add table` line with its owner comment.
var ownerCommentLine = regexp.MustCompile(`(add table \S+ \S+) \{ comment "[^"]*" ; \}\n`)

// earlierVersion takes a table for an earlier version's only when nothing in it is what this backend
// never makes.
func TestEarlierVersionRule(t *testing.T) {
	m, err := build(externalIPRuleset(rules.IPv4, threeEntries(rules.IPv4)))
	if err != nil {
		t.Fatal(err)
	}
	ours := &TableShape{Maps: []string{"external-ips"}, Sets: []string{"external-ips_keys"}, Counters: m.counters}
	for _, c := range m.chains {
		ours.Chains = append(ours.Chains, c.chain)
	}
	if why := earlierVersion(ours); why != "" {
		t.Fatalf("a cold apply's table: %s", why)
	}
	hooked := func(prio string) knftables.Chain {
		return knftables.Chain{Name: "input", Type: knftables.PtrTo(knftables.FilterType), Hook: knftables.PtrTo(knftables.InputHook),
			Priority: knftables.PtrTo(knftables.BaseChainPriority(prio)), Policy: knftables.PtrTo(knftables.AcceptPolicy)}
	}
	for name, change := range map[string]func(s *TableShape){
		"no chain":          func(s *TableShape) { s.Chains = nil },
		"a chain at prio 0": func(s *TableShape) { s.Chains = append(s.Chains, hooked("0")) },
		"policy drop": func(s *TableShape) {
			c := hooked("-10")
			c.Policy = knftables.PtrTo(knftables.DropPolicy)
			s.Chains = append(s.Chains, c)
		},
		"a chain named Input":   func(s *TableShape) { s.Chains = append(s.Chains, knftables.Chain{Name: "Input"}) },
		"a set of no map":       func(s *TableShape) { s.Sets = append(s.Sets, "allowed") },
		"a counter not cnt-":    func(s *TableShape) { s.Counters = append(s.Counters, "packets") },
		"a flowtable":           func(s *TableShape) { s.Others = append(s.Others, "flowtable ft") },
		"a map of another name": func(s *TableShape) { s.Maps = append(s.Maps, "Ports") },
	} {
		s := *ours
		s.Chains, s.Sets, s.Counters, s.Others, s.Maps = slices.Clone(ours.Chains), slices.Clone(ours.Sets), slices.Clone(ours.Counters), nil, slices.Clone(ours.Maps)
		change(&s)
		if why := earlierVersion(&s); why == "" {
			t.Errorf("%s: taken for an earlier version's table", name)
		}
	}
	if why := earlierVersion(&TableShape{Chains: []knftables.Chain{hooked("-10")}}); why != "" {
		t.Errorf("a filter chain at input priority -10: %s", why)
	}
}
