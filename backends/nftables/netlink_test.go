package nftables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	gnft "github.com/google/nftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestKernelColdLoadOverNetlink: a new table whose maps go over netlink first (loadMaps, what the
// real kernel's backend does) ends up exactly as the one `nft -f` transaction makes it, for both
// families; later element changes and a Verify that lists the table work on it as on any other;
// and when the netlink load fails, nft -f sends the maps with the rest.
func TestKernelColdLoadOverNetlink(t *testing.T) {
	eachFamily(t, "nnm-nl", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		nf := string(nftFamily(f))
		entries := manyEntries(f, 3000)
		rs := externalIPRuleset(f, entries)
		table := TableName(rs.Fix)
		listing := func() string { return listTable(t, ns, f, table) }

		// The reference: one nft -f transaction.
		applyIn(ctx, t, ns, newRealKernel().backend(t), rs)
		want := listing()
		ns.MustExec("nft", "delete", "table", nf, table)

		viaNetlink := newRealKernel().backend(t)
		loads := 0
		opsOf(viaNetlink).loadMaps = func(m *model) error { loads++; return loadMaps(m) }
		inNS(t, ns, func() error { return apply(ctx, viaNetlink, rs) })
		if loads != 1 {
			t.Fatalf("loadMaps ran %d times for a new table, want 1", loads)
		}
		if got := listing(); got != want {
			t.Fatalf("table loaded over netlink differs from one nft -f:\n%s\nwant:\n%s", got, want)
		}
		if n := strings.Count(want, " : ") - 1; n != len(entries) { // - 1: the map's type line
			t.Fatalf("the reference table has %d map elements, want %d", n, len(entries))
		}

		// An element change on it, then a Verify that lists it (the generation moved: someone
		// else committed), find nothing wrong; the table exists now, so no more netlink loads.
		changed := externalIPRuleset(f, append(entries[1:len(entries):len(entries)], entry(f, 5000, rules.UDP, 53, 53)))
		inNS(t, ns, func() error { return apply(ctx, viaNetlink, changed) })
		ns.MustExec("nft", "add table "+nf+" someone-else")
		inNS(t, ns, func() error {
			res, err := verify(ctx, viaNetlink, changed)
			if err == nil && (res.Repaired || res.Applied || !res.ReadBack) {
				err = errors.New("the Verify after an element change repaired, applied or did not read back")
			}
			return err
		})
		if loads != 1 {
			t.Fatalf("loadMaps ran %d times, want 1 (only for the new table)", loads)
		}

		// A failing netlink load: nft -f carries the maps, and the table is the same.
		ns.MustExec("nft", "delete", "table", nf, table)
		failing := newRealKernel().backend(t)
		opsOf(failing).loadMaps = func(*model) error { return errors.New("netlink unavailable") }
		inNS(t, ns, func() error { return apply(ctx, failing, rs) })
		if got := listing(); got != want {
			t.Fatalf("after a failed netlink load the table differs:\n%s\nwant:\n%s", got, want)
		}
	})
}

// TestKernelListTablesOverNetlink: listRealTables names every table of its family in the calling
// thread's namespace, whoever owns it (the caller filters by TablePrefix), and none of the other
// family; a family with no table lists none; and it runs no nft.
func TestKernelListTablesOverNetlink(t *testing.T) {
	netns.Require(t, "nft")
	ns := netns.New(t, "nnm-lt")
	list := func(f knftables.Family) []string {
		t.Helper()
		var tables []TableInfo
		if err := ns.Do(func() (err error) { tables, err = listRealTables(context.Background(), f); return err }); err != nil {
			t.Fatal(err)
		}
		names := tableNames(tables)
		slices.Sort(names)
		return names
	}
	if got := list(knftables.IPv6Family); len(got) != 0 {
		t.Fatalf("a new namespace lists ip6 tables %q", got)
	}
	ns.MustExec("nft", "add table ip nnm-a")
	ns.MustExec("nft", "add table ip someone-else")
	ns.MustExec("nft", "add table ip6 nnm-b")
	ns.MustExec("nft", "add table inet nnm-c")
	// No nft from here on: the listing is a table dump over netlink. `nft --json list tables`
	// fetched the whole ruleset, rules included (6.4 s of CPU beside 30,000 iptables-nft rules), and
	// started over whenever another process committed meanwhile: during the 30,000-Service
	// benchmark's three minutes of changes it never finished (BENCHMARKS.md).
	t.Setenv("PATH", t.TempDir())
	if got, want := list(knftables.IPv4Family), []string{"nnm-a", "someone-else"}; !slices.Equal(got, want) {
		t.Fatalf("ip tables %q, want %q", got, want)
	}
	if got, want := list(knftables.IPv6Family), []string{"nnm-b"}; !slices.Equal(got, want) {
		t.Fatalf("ip6 tables %q, want %q", got, want)
	}
	if _, err := listRealTables(context.Background(), knftables.InetFamily); err == nil {
		t.Fatal("listRealTables accepted the inet family, which the backend never uses")
	}
}

// TestKernelElementsOverNetlink: changes of map entries alone go over netlink as one transaction
// (sendElementDiff, what the real kernel's backend does) and no nft runs for them; after each the
// table is exactly what one nft -f of the same ruleset makes in a fresh namespace, elements'
// comments included. When the kernel refuses the transaction (an element to delete is gone: someone
// deleted it), nothing of it is applied and the table is rewritten from a listing.
func TestKernelElementsOverNetlink(t *testing.T) {
	eachFamily(t, "nnm-el", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		ref := netns.New(t, "nnm-elref")
		k := newRealKernel()
		b := k.backend(t)
		sends := 0
		opsOf(b).sendElements = func(old, m *model) (int, int, error) { sends++; return sendElementDiff(old, m) }
		entries := manyEntries(f, 300)
		rs := func() *rules.Ruleset { return externalIPRuleset(f, slices.Clone(entries)) }
		applyIn(ctx, t, ns, b, rs())
		table := TableName(rs().Fix)
		rec := k.rec(nftFamily(f), table)
		// check applies the entries now: one netlink transaction, and nft runs only for a rewrite.
		check := func(what string, rewrite bool) {
			t.Helper()
			n, s := rec.count(), sends
			applyIn(ctx, t, ns, b, rs())
			if sends-s != 1 || (rec.count() > n) != rewrite {
				t.Fatalf("%s: %d netlink transactions and %d nft transactions, want 1 and a rewrite %v", what, sends-s, rec.count()-n, rewrite)
			}
			ref.MustExec("nft", "flush", "ruleset")
			applyIn(ctx, t, ref, newRealKernel().backend(t), rs())
			if got, want := listTable(t, ns, f, table), listTable(t, ref, f, table); got != want {
				t.Fatalf("%s: the table differs from one nft -f of the same ruleset:\n%s\nwant:\n%s", what, got, want)
			}
		}
		entries = append(entries, entry(f, 1000, rules.UDP, 53, 53), entry(f, 1001, rules.TCP, 443, 8443))
		check("two entries added", false)
		entries = slices.Delete(entries, 10, 13)
		check("three entries deleted", false)
		entries[20].To = netip.AddrPortFrom(entries[20].To.Addr(), 9999)
		entries[20].Comment += " moved"
		check("one entry re-pointed (same key)", false)
		entries = append(slices.Delete(entries, 0, 1), entry(f, 1002, rules.TCP, 80, 80))
		entries[40].To = netip.AddrPortFrom(entries[40].To.Addr(), 7777)
		check("deleted, added and re-pointed in one change", false)

		gone := element("external-ips", entries[50])
		ns.MustExec("nft", "delete", "element", string(nftFamily(f)), table, "external-ips", "{ "+strings.Join(gone.Key, " . ")+" }")
		entries = slices.Delete(entries, 50, 51)
		check("an entry deleted that someone deleted first", true)
	})
}

// TestKernelBoundedElementTransactions: a cold load and a change of map entries larger than
// maxOpsPerTransaction go in several netlink transactions, none larger than the bound (plus one
// entry's operations), and a re-pointed entry's delete and add are always in the same one, so no
// entry that stays is ever missing from the map; the table ends exactly as one nft -f of the same
// ruleset makes it; the Driver counts every transaction as a commit of ours, so a Verify right after
// lists nothing.
func TestKernelBoundedElementTransactions(t *testing.T) {
	eachFamily(t, "nnm-bt", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		ref := netns.New(t, "nnm-btref")
		k := newRealKernel()
		b := k.backend(t)
		var sent [][4]int // per transaction: element deletes, key deletes, element adds, key adds
		batchSent = func(ops [][4][]gnft.SetElement) {
			var n [4]int
			for _, o := range ops {
				// A map element deleted whose key stays is re-pointed: its add must be here too.
				adds := map[string]bool{}
				for _, e := range o[2] {
					adds[string(e.Key)] = true
				}
				keyDeletes := map[string]bool{}
				for _, e := range o[1] {
					keyDeletes[string(e.Key)] = true
				}
				for _, e := range o[0] {
					if !keyDeletes[string(e.Key)] && !adds[string(e.Key)] {
						t.Errorf("transaction %d deletes the element of a kept key %x without adding it again", len(sent)+1, e.Key)
					}
				}
				for i := range o {
					n[i] += len(o[i])
				}
			}
			sent = append(sent, n)
		}
		t.Cleanup(func() { batchSent = nil })
		transactions := 0
		opsOf(b).loadMaps = loadMaps
		opsOf(b).sendElements = func(old, m *model) (int, int, error) {
			ops, n, err := sendElementDiff(old, m)
			transactions += n
			return ops, n, err
		}
		const n = maxOpsPerTransaction * 3 / 4 // 1.5 bounds of operations with the keys
		entries := manyEntries(f, n)
		rs := func() *rules.Ruleset { return externalIPRuleset(f, slices.Clone(entries)) }
		table := TableName(rs().Fix)
		rec := k.rec(nftFamily(f), table)
		check := func(what string, wantOps int) {
			t.Helper()
			total := 0
			for i, s := range sent {
				ops := s[0] + s[1] + s[2] + s[3]
				if ops > maxOpsPerTransaction+1 {
					t.Fatalf("%s: transaction %d of %d has %d operations, more than %d", what, i+1, len(sent), ops, maxOpsPerTransaction+1)
				}
				total += ops
			}
			if len(sent) < 2 || total != wantOps {
				t.Fatalf("%s: %d transactions of %v operations, want %d operations in at least 2", what, len(sent), sent, wantOps)
			}
			ref.MustExec("nft", "flush", "ruleset")
			applyIn(ctx, t, ref, newRealKernel().backend(t), rs())
			if got, want := listTable(t, ns, f, table), listTable(t, ref, f, table); got != want {
				t.Fatalf("%s: the table differs from one nft -f of the same ruleset:\n%s\nwant:\n%s", what, got, want)
			}
			sent = nil
		}

		applyIn(ctx, t, ns, b, rs())
		check("cold load", 2*n)

		for i := range n / 2 {
			entries[i].To = netip.AddrPortFrom(entries[i].To.Addr(), 9000)
		}
		entries = entries[:n-n/4]
		for i := range n / 4 {
			entries = append(entries, entry(f, 3*n+i, rules.UDP, 53, 53))
		}
		applyIn(ctx, t, ns, b, rs())
		if transactions < 2 {
			t.Fatalf("the change sent %d transactions, want at least 2", transactions)
		}
		check("re-pointed, deleted and added", 2*(n/2)+2*2*(n/4))

		lists := rec.listCount()
		inNS(t, ns, func() error {
			res, err := verify(ctx, b, rs())
			if err == nil && (res.Repaired || res.Applied) {
				err = errors.New("the Verify after the change repaired or applied")
			}
			return err
		})
		if got := rec.listCount() - lists; got != 0 {
			t.Fatalf("the Verify after a change of %d transactions listed the table %d times: the generation did not prove it ours", transactions, got)
		}
	})
}
