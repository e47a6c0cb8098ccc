package nodestate_test

// Address plan: clients 192.0.2.7 and 2001:db8::7 send to 198.51.100.1 / 2001:db8:1::1 (a hostPort
// or NodePort), DNATed to pods 10.244.1.10 / fd00:10:244:1::a.

import (
	"context"
	"net/netip"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
)

// The kernel filters the dump: EachDNAT hands over only the DNATed entries of the family and
// protocol asked for, one at a time; stopping early ends the dump; Delete deletes by kernel id.
func TestKernelEachDNAT(t *testing.T) {
	netns.RequireKernel(t)
	ns := netns.New(t, "nnm-ct")
	ctx := context.Background()
	for _, tc := range []struct {
		family            rules.Family
		client, node, pod string
	}{
		{family: rules.IPv4, client: "192.0.2.7", node: "198.51.100.1", pod: "10.244.1.10"},
		{family: rules.IPv6, client: "2001:db8::7", node: "2001:db8:1::1", pod: "fd00:10:244:1::a"},
	} {
		c, n, p := netip.MustParseAddr(tc.client), netip.MustParseAddr(tc.node), netip.MustParseAddr(tc.pod)
		var entries []ctfill.Entry
		for i := range 3 { // UDP, DNATed: the only ones to be handed over
			entries = append(entries, ctfill.Entry{Protocol: ctfill.UDP, Src: netip.AddrPortFrom(c, uint16(40000+i)),
				Dst: netip.AddrPortFrom(n, 8125), DNATTo: netip.AddrPortFrom(p, 8125)})
		}
		entries = append(entries,
			ctfill.Entry{Protocol: ctfill.TCP, Src: netip.AddrPortFrom(c, 41000), Dst: netip.AddrPortFrom(n, 80), DNATTo: netip.AddrPortFrom(p, 80)},
			ctfill.Entry{Protocol: ctfill.UDP, Src: netip.AddrPortFrom(c, 42000), Dst: netip.AddrPortFrom(p, 8125)}) // not NATed
		if err := ns.Do(func() error { return ctfill.Create(len(entries), func(i int) ctfill.Entry { return entries[i] }) }); err != nil {
			t.Fatal(err)
		}
		var got []nodestate.ConntrackEntry
		each := func(stopAfter int) {
			got = nil
			if err := ns.Do(func() error {
				return nodestate.NewConntrack().EachDNAT(ctx, tc.family, rules.UDP, func(e nodestate.ConntrackEntry) bool {
					got = append(got, e)
					return len(got) < stopAfter
				})
			}); err != nil {
				t.Fatal(err)
			}
		}
		each(100)
		if len(got) != 3 {
			t.Fatalf("%s: EachDNAT(udp) handed over %d entries, want the 3 DNATed UDP ones: %v", tc.family, len(got), got)
		}
		for _, e := range got {
			if e.Protocol != rules.UDP || e.Family != tc.family || e.Reply.Src != netip.AddrPortFrom(p, 8125) || e.Orig.Dst.Addr() != n || e.ID == 0 {
				t.Errorf("%s: entry %v (id %d): want UDP to %s DNATed to %s:8125", tc.family, e, e.ID, n, p)
			}
		}
		each(1)
		if len(got) != 1 {
			t.Errorf("%s: EachDNAT went on after fn returned false (%d entries)", tc.family, len(got))
		}
		var deleted int
		if err := ns.Do(func() (err error) { deleted, err = nodestate.NewConntrack().Delete(ctx, got); return err }); err != nil || deleted != 1 {
			t.Fatalf("%s: Delete = %d, %v", tc.family, deleted, err)
		}
		each(100)
		if len(got) != 2 {
			t.Errorf("%s: %d DNATed UDP entries after deleting one, want 2", tc.family, len(got))
		}
	}
}
