package nftables

import (
	"context"
	"strings"
	"testing"

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
