package nftables

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// zoned is entry i with a DNAT target that carries an IPv6 zone: rules.Validate and the renderer
// take it, nft refuses it ("fd00:96::…%eth0" is no address it parses), and the netlink encoder
// refuses it too (its binary form has no zone), so a cold load falls back to nft -f.
func zoned(i int) rules.MapEntry {
	e := entry(rules.IPv6, i, rules.TCP, 80, 8080)
	e.To = netip.AddrPortFrom(e.To.Addr().WithZone("eth0"), e.To.Port())
	e.Comment = "tenant/bad"
	return e
}

// TestKernelRejectedObjectIsSkipped (#41): one object's map entry is refused by nft; the Driver
// finds it with nft --check, programs every other entry and reports the object by name, on the
// production backend (elements over netlink) and on the test kernel (elements as nft -f text).
// What was programmed before stays; a later change of the good entries goes in with the bad one
// still out; once the object's entry is good it is programmed.
func TestKernelRejectedObjectIsSkipped(t *testing.T) {
	netns.Require(t, "nft")
	for name, mk := range map[string]func(t *testing.T) *Backend{
		"production": func(t *testing.T) *Backend {
			b, err := New(Options{})
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"nft-text": func(t *testing.T) *Backend { return newRealKernel().backend(t) },
	} {
		t.Run(name, func(t *testing.T) {
			ns := netns.New(t, "nnm-nft")
			ctx := context.Background()
			f := rules.IPv6
			b := mk(t)
			good := threeEntries(f)
			applyIn(ctx, t, ns, b, externalIPRuleset(f, good))
			table := TableName("ipvs-externalip-dnat")
			reconcile := func(entries []rules.MapEntry, mode backend.Mode) backend.Result {
				t.Helper()
				var res backend.Result
				inNS(t, ns, func() (err error) {
					res, err = b.Reconcile(ctx, "ipvs-externalip-dnat", f, externalIPRuleset(f, entries), mode)
					return err
				})
				return res
			}
			withBad := append(append([]rules.MapEntry(nil), good...), zoned(9))
			res := reconcile(withBad, backend.Trust)
			if len(res.Rejected) != 1 || res.Rejected[0].Object != "tenant/bad" || !strings.Contains(res.Rejected[0].Detail, "%eth0") {
				t.Fatalf("rejected %+v; want tenant/bad with nft's message", res.Rejected)
			}
			listing := listTable(t, ns, f, table)
			for _, e := range good {
				if !strings.Contains(listing, e.Addr.String()) {
					t.Fatalf("good entry %s is not in the table:\n%s", e.Key(), listing)
				}
			}
			if strings.Contains(listing, zoned(9).Addr.String()) {
				t.Fatalf("the refused entry is in the table:\n%s", listing)
			}
			// A Verify finds the kernel as recorded and still reports the object.
			if res := reconcile(withBad, backend.Verify); res.Repaired || res.Applied || len(res.Rejected) != 1 {
				t.Fatalf("Verify: %+v; want nothing done, the object still reported", res)
			}
			// A change of the good entries goes in; the bad object stays out without a search.
			changed := append(append([]rules.MapEntry(nil), good[1:]...), zoned(9))
			if res := reconcile(changed, backend.Trust); !res.Applied || len(res.Rejected) != 1 {
				t.Fatalf("a change beside the refused object: %+v", res)
			}
			if listing := listTable(t, ns, f, table); strings.Contains(listing, good[0].Addr.String()+" . tcp . 80") {
				t.Fatalf("the removed entry is still there:\n%s", listing)
			}
			// The object fixed: programmed, nothing reported.
			fixed := zoned(9)
			fixed.To = netip.AddrPortFrom(fixed.To.Addr().WithZone(""), fixed.To.Port())
			if res := reconcile(append(good[1:len(good):len(good)], fixed), backend.Trust); len(res.Rejected) != 0 {
				t.Fatalf("the fixed object: %+v", res)
			}
			if listing := listTable(t, ns, f, table); !strings.Contains(listing, fixed.Addr.String()) {
				t.Fatalf("the fixed entry is not in the table:\n%s", listing)
			}
			if res := reconcile(append(good[1:len(good):len(good)], fixed), backend.Verify); res.Repaired || !reflect.DeepEqual(res.Rejected, []backend.Rejection(nil)) {
				t.Fatalf("Verify after: %+v", res)
			}
		})
	}
}
