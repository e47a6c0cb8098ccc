package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestKernelRejectedObjectIsSkipped (#41): one object's map entry, a DNAT target with an IPv6 zone
// (rules.Validate and the renderer take it), is refused by ip6tables-restore; the Driver finds it
// with ip6tables-restore --test, programs every other entry and reports the object by name. What
// was programmed before stays; a later change of the good entries goes in with the bad one still
// out; once the object's entry is good it is programmed.
func TestKernelRejectedObjectIsSkipped(t *testing.T) {
	f := rules.IPv6
	k := newKernel(t, NFT, f)
	b := k.backend()
	ctx := context.Background()
	good := externalIP(f).Maps[0].Entries
	rs := func(entries []rules.MapEntry) *rules.Ruleset {
		r := externalIP(f)
		r.Maps[0].Entries = entries
		return r
	}
	mustApply(t, b, rs(good))
	bad := rules.MapEntry{Addr: netip.MustParseAddr("2001:db8:ff::99"), Protocol: rules.TCP, Port: 80,
		To: netip.AddrPortFrom(netip.MustParseAddr("fd00:96::99%eth0"), 80), Comment: "tenant/bad"}
	reconcile := func(entries []rules.MapEntry, mode backend.Mode) backend.Result {
		t.Helper()
		res, err := b.Reconcile(ctx, "ipvs-externalip-dnat", f, rs(entries), mode)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	withBad := append(append([]rules.MapEntry(nil), good...), bad)
	res := reconcile(withBad, backend.Trust)
	if len(res.Rejected) != 1 || res.Rejected[0].Object != "tenant/bad" || !strings.Contains(res.Rejected[0].Detail, "fd00:96::99%eth0") {
		t.Fatalf("rejected %+v; want tenant/bad with ip6tables-restore's message and line", res.Rejected)
	}
	save := k.save()
	for _, e := range good {
		if !strings.Contains(save, e.Comment) {
			t.Fatalf("good entry %s (%s) is not in the kernel:\n%s", e.Key(), e.Comment, save)
		}
	}
	if strings.Contains(save, "tenant/bad") {
		t.Fatalf("the refused entry is in the kernel:\n%s", save)
	}
	if res := reconcile(withBad, backend.Verify); res.Repaired || res.Applied || len(res.Rejected) != 1 {
		t.Fatalf("Verify: %+v; want nothing done, the object still reported", res)
	}
	// A change of the good entries goes in; the bad object stays out.
	changed := append(append([]rules.MapEntry(nil), good[1:]...), bad)
	if res := reconcile(changed, backend.Trust); !res.Applied || len(res.Rejected) != 1 {
		t.Fatalf("a change beside the refused object: %+v", res)
	}
	if save := k.save(); strings.Contains(save, good[0].Comment) {
		t.Fatalf("the removed entry %s is still there:\n%s", good[0].Comment, save)
	}
	fixed := bad
	fixed.To = netip.AddrPortFrom(bad.To.Addr().WithZone(""), 80)
	if res := reconcile(append(good[1:len(good):len(good)], fixed), backend.Trust); len(res.Rejected) != 0 {
		t.Fatalf("the fixed object: %+v", res)
	}
	if save := k.save(); !strings.Contains(save, "tenant/bad") {
		t.Fatalf("the fixed entry is not in the kernel:\n%s", save)
	}
	if ok, err := inSync(ctx, b, rs(append(good[1:len(good):len(good)], fixed))); !ok || err != nil {
		t.Fatalf("Verify after: in sync %v, %v", ok, err)
	}
}
