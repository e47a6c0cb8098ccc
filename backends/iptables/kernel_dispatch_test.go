package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestKernelDispatchTree: 300 scattered entries (300 buckets, a dispatch tree of nodes) in a test
// namespace, nft and legacy, IPv4 and IPv6: real connections to the first, a middle and the last
// entry are DNATed through the tree; an entry in a new bucket is one restore with no iptables-save
// (the node listing it is rewritten) and is reached; an emptied bucket goes with its dispatch rule;
// a node chain flushed by someone else is found by Verify and restored; Remove from a fresh process
// leaves no NNM- chain.
func TestKernelDispatchTree(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		local := byFamily(k.family, "10.99.0.1", "fd00:99::1")
		k.ns.MustExec("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
		k.ns.MustExec("ip", "link", "set", "d1", "up")
		k.ns.MustExec("ip", "link", "set", "d0", "up")
		if k.family == rules.IPv6 {
			k.ns.MustExec("ip", "addr", "add", local+"/64", "dev", "d0", "nodad")
			k.ns.MustExec("ip", "-6", "route", "add", "default", "dev", "d0")
		} else {
			k.ns.MustExec("ip", "addr", "add", local+"/24", "dev", "d0")
			k.ns.MustExec("ip", "route", "add", "default", "dev", "d0")
		}
		const port = 7783
		rs := func(n int, skip ...int) *rules.Ruleset {
			r := scatteredDNAT(k.family, n)
			r.Chains = r.Chains[:3] // no MASQUERADE: the connections stay on the node
			var kept []rules.MapEntry
			for i, e := range r.Maps[0].Entries {
				if !contains(skip, i) {
					e.To = netip.AddrPortFrom(netip.MustParseAddr(local), port)
					kept = append(kept, e)
				}
			}
			r.Maps[0].Entries = kept
			return r
		}
		b := k.backend()
		mustApply(t, b, rs(300, 299))
		save := k.save()
		nodes := strings.Count(save, ":NNM-EXTIP-DNAT-T")
		if nodes < 10 {
			t.Fatalf("299 buckets made %d dispatch nodes:\n%s", nodes, save)
		}
		if n := strings.Count(save, "-A NNM-EXTIP-DNAT -d "); n < 2 || n > 1<<dispatchStride {
			t.Errorf("the DNAT chain holds %d dispatch rules, want the tree's top level (2 to %d)", n, 1<<dispatchStride)
		}
		for _, i := range []int{0, 150, 298} {
			if got := k.connect(scatteredAddr(k.family, i).String(), []uint16{port}); got != port {
				t.Errorf("connection to entry %d (%s) reached port %d, want %d", i, scatteredAddr(k.family, i), got, port)
			}
		}

		// Entry 299 comes, in a bucket of its own: one restore and listings, no save.
		k.run.reset()
		mustApply(t, b, rs(300))
		if c := k.run.reset(); c[k.bin("restore")] != 1 || c[k.bin("save")] != 0 || c[k.bin("")] > 3 {
			t.Errorf("a new bucket ran %v, want 1 restore, at most 3 listings and no save", c)
		}
		if ok, err := inSync(ctx, b, rs(300)); err != nil || !ok {
			t.Errorf("in sync after a new bucket = %v, %v; want true", ok, err)
		}
		if got := k.connect(scatteredAddr(k.family, 299).String(), []uint16{port}); got != port {
			t.Errorf("connection to the new entry reached port %d, want %d", got, port)
		}

		// Entry 150 goes: its bucket and dispatch rule go.
		bucket := bucketName("EXTIP-DNAT", 1, bucketPrefix(scatteredAddr(k.family, 150)))
		mustApply(t, b, rs(300, 150))
		s := k.save()
		mustLack(t, s, bucket)
		if ok, err := inSync(ctx, b, rs(300, 150)); err != nil || !ok {
			t.Errorf("in sync after a bucket removal = %v, %v; want true", ok, err)
		}
		if got := k.connect(scatteredAddr(k.family, 0).String(), []uint16{port}); got != port {
			t.Errorf("after the removal, connection to entry 0 reached port %d, want %d", got, port)
		}

		// A node flushed by someone else: Verify notices and restores it.
		var node string
		for _, l := range strings.Split(s, "\n") {
			if name, ok := strings.CutPrefix(l, ":NNM-EXTIP-DNAT-T"); ok {
				node = "NNM-EXTIP-DNAT-T" + strings.Fields(name)[0]
				break
			}
		}
		k.ipt("-t", "nat", "-F", node)
		if ok, err := inSync(ctx, b, rs(300, 150)); err != nil || ok {
			t.Errorf("Verify after flushing node %s found it in sync (%v, %v)", node, ok, err)
		}
		if after := k.save(); after != s {
			t.Errorf("Verify did not restore node %s:\n%s", node, lineDiffs(s, after))
		}

		// Prefixes chosen to nest the tree as deep as it goes: the kernel takes it (nf_tables
		// refuses jumps nested 16 deep).
		if k.family == rules.IPv6 {
			nested := nestedDNAT()
			nested.Chains = nested.Chains[:3]
			mustApply(t, b, nested)
		}

		// A fresh process's Remove finds nodes and buckets through the dispatch rules.
		if err := remove(ctx, k.backend(), "ipvs-externalip-dnat", k.family); err != nil {
			t.Fatal(err)
		}
		mustLack(t, k.save(), "NNM-")
	})
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
