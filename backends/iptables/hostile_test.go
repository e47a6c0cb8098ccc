package iptables

// Issue #41 rows 1 and 6: names derived from a tenant's data and foreign rules' text must not fail a
// fix's unit. Both run against the real kernel in a test namespace, with both variants.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// collidingV6 are two IPv6 /124s whose bucket names are the same 12 hex digits of SHA-256
// (C077AA69E87C; found in a minute by the birthday bound, 2^24 hashes): a tenant found such a pair
// of the /120 buckets of the time and put both in one Service's ingress (issue #41 row 1).
var collidingV6 = [2]string{"fd00:ad3::65d:8130/124", "fd00:ad3::679:cb90/124"}

// TestBucketNameCollisionResolved: the two colliding /124s get distinct names, the later in address
// order renamed, and the name each gets does not depend on the order of the entries.
func TestBucketNameCollisionResolved(t *testing.T) {
	a, b := netip.MustParsePrefix(collidingV6[0]), netip.MustParsePrefix(collidingV6[1])
	if bucketName("EXTIP-DNAT", 1, a) != bucketName("EXTIP-DNAT", 1, b) {
		t.Fatalf("the test prefixes no longer collide: %s, %s", bucketName("EXTIP-DNAT", 1, a), bucketName("EXTIP-DNAT", 1, b))
	}
	names := func(order ...int) map[netip.Prefix]string {
		rs := collisionRuleset(netip.MustParseAddr("fd00:99::1"), order...)
		chains, _, err := renderChains(rs, scope{})
		if err != nil {
			t.Fatalf("render: %v", err)
		}
		out := map[netip.Prefix]string{}
		for _, c := range chains {
			if c.parent != "" {
				out[c.prefix] = c.name
			}
		}
		return out
	}
	got := names(0, 1)
	if got[a] == got[b] || got[a] != bucketName("EXTIP-DNAT", 1, a) {
		t.Errorf("bucket names %v: want distinct, the lower prefix keeping its plain name", got)
	}
	if again := names(1, 0); again[a] != got[a] || again[b] != got[b] {
		t.Errorf("names depend on the order of the entries: %v then %v", got, again)
	}
	if alone := names(1); alone[b] != bucketName("EXTIP-DNAT", 1, b) {
		t.Errorf("without the other prefix, %s is named %s, want its plain name", b, alone[b])
	}
}

// collisionRuleset is the DNAT fix's chains (without MASQUERADE) with two entries, ports 80 and
// 8080, in each colliding /124 (the host ::1 of each) to local:7781+i: two rules a bucket, so each
// is a chain of its own (one rule would be inlined, and its bucket's name never used).
func collisionRuleset(local netip.Addr, which ...int) *rules.Ruleset {
	r := externalIP(rules.IPv6)
	r.Chains = r.Chains[:3]
	r.Maps[0].Entries = nil
	for _, i := range which {
		for _, port := range []uint16{80, 8080} {
			r.Maps[0].Entries = append(r.Maps[0].Entries, rules.MapEntry{
				Addr: netip.MustParsePrefix(collidingV6[i]).Addr().Next(), Protocol: rules.TCP, Port: port,
				To: netip.AddrPortFrom(local, uint16(7781+i)), Comment: fmt.Sprintf("tenant/collide:%d", i)})
		}
	}
	return r
}

// TestKernelBucketNameCollision (issue #41 row 1): a ruleset with entries in both colliding /124s
// is applied (on main at d0ea2ac: "kernel chain NNM-EXTIP-DNAT-1E0A25A9327A is rendered twice"),
// real connections to both addresses are DNATed to their own targets, a one-entry change in the
// renamed (higher) bucket applies, a fresh process verifies it in sync and removes it all. That
// change takes the full way: a change that keeps every bucket names only its own buckets
// (bucketNames), so the renamed one gets its twin's name, which the record shows with other rules.
func TestKernelBucketNameCollision(t *testing.T) {
	ctx := context.Background()
	for _, v := range []Variant{NFT, Legacy} {
		t.Run(string(v), func(t *testing.T) {
			k := newKernel(t, v, rules.IPv6)
			local := netip.MustParseAddr("fd00:99::1")
			k.ns.MustExec("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
			k.ns.MustExec("ip", "link", "set", "d1", "up")
			k.ns.MustExec("ip", "link", "set", "d0", "up")
			k.ns.MustExec("ip", "addr", "add", local.String()+"/64", "dev", "d0", "nodad")
			k.ns.MustExec("ip", "route", "add", "fd00:ad3::/64", "dev", "d0")
			b := k.backend()
			rs := collisionRuleset(local, 0, 1)
			mustApply(t, b, rs)
			ports := []uint16{7781, 7782}
			for i, p := range collidingV6 {
				dst := netip.MustParsePrefix(p).Addr().Next().String()
				if got := k.connect(dst, ports); got != ports[i] {
					t.Errorf("connection to [%s]:80 reached port %d, want %d", dst, got, ports[i])
				}
			}
			changed := collisionRuleset(local, 0, 1)
			changed.Maps[0].Entries[len(changed.Maps[0].Entries)-1].Comment = "tenant/collide:renamed" // in the renamed bucket
			mustApply(t, b, changed)
			if ok, err := inSync(ctx, k.backend(), changed); err != nil || !ok {
				t.Errorf("a fresh process finds the kernel in sync = %v, %v; want true", ok, err)
			}
			mustContain(t, k.save(), "tenant/collide:renamed")
			if err := remove(ctx, k.backend(), changed.Fix, rules.IPv6); err != nil {
				t.Fatal(err)
			}
			mustLack(t, k.save(), "NNM-")
		})
	}
}

// hostileComments are comments iptables accepts on a foreign rule (`-m comment --comment`, 255
// bytes at most): iptables-save prints a newline in one as it is, inside the quotes, so the rule
// spans two lines of the dump; the others look like lines of a dump or like our own rules.
var hostileComments = []string{
	"evil\nline",
	"evil\n-A NNM-EXTIP-DNAT -j ACCEPT\nCOMMIT\n*nat\n:NNM-X - [0:0]",
	"network-node-manager:invalid-drop\n-A INPUT -j NNM-INVALID-INPUT",
	"\n",
	"quote\" back\\slash 'single' \ttab\rcr",
	strings.Repeat("\n\"", 60),
}

// TestKernelForeignCommentNewline (issue #41 row 6): foreign rules with those comments in INPUT and
// in a foreign chain do not fail our reconciles (on main at d0ea2ac every one failed with
// "unterminated quote"), nor a fresh process's Verify and removal, and they stay byte-identical.
func TestKernelForeignCommentNewline(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.ipt("-N", "FOREIGN")
		for _, c := range hostileComments {
			k.ipt("-A", "INPUT", "-m", "comment", "--comment", c, "-j", "ACCEPT")
			k.ipt("-A", "FOREIGN", "-m", "comment", "--comment", c, "-j", "RETURN")
		}
		k.ipt("-A", "INPUT", "-j", "FOREIGN")
		// In nat too, where the DNAT fix's chains go.
		k.ipt("-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", hostileComments[1], "-j", "RETURN")
		before := foreign(k.save())
		if !strings.Contains(before, "evil\nline") {
			t.Fatalf("iptables-save does not print the newline as it is; the test's premise is stale:\n%s", before)
		}
		rss := []*rules.Ruleset{invalidDrop(k.family), externalIP(k.family)}
		mustApply(t, k.backend(), rss...)
		for _, rs := range rss {
			if ok, err := inSync(ctx, k.backend(), rs); err != nil || !ok {
				t.Errorf("%s: a fresh process finds the kernel in sync = %v, %v; want true", rs.Fix, ok, err)
			}
		}
		if _, err := k.backend().Counters(ctx, "invalid-drop", k.family); err != nil {
			t.Errorf("counters: %v", err)
		}
		if after := foreign(k.save()); after != before {
			t.Errorf("the foreign rules changed:\n%s", lineDiffs(before, after))
		}
		for _, rs := range rss {
			if err := remove(ctx, k.backend(), rs.Fix, k.family); err != nil {
				t.Fatal(err)
			}
		}
		s := k.save()
		d, err := parseSave(s)
		if err != nil || d.unparsed != 0 {
			t.Fatalf("parse: %v, %d lines left out (%s)", err, d.unparsed, d.firstUnparsed)
		}
		for _, tb := range d.tables {
			for _, c := range tb.chains {
				if isOurs(c.name) {
					t.Errorf("chain %s/%s is left", tb.name, c.name)
				}
				for _, r := range c.rules {
					if isOurs(r.target) {
						t.Errorf("rule %q is left", r.line())
					}
				}
			}
		}
		if after := foreign(s); after != before {
			t.Errorf("the foreign rules changed:\n%s", lineDiffs(before, after))
		}
	})
}

// TestKernelForeignNNMChains (issue #41 row 10, iptables side): an NNM- chain that no jump of ours
// leads to is someone else's: RemoveAll (what a nftables-backend agent runs at start), CleanupPlan and
// Cleanup leave it and the rule jumping to it, and remove ours. On main at d0ea2ac they deleted
// every NNM- chain by its name.
func TestKernelForeignNNMChains(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.ipt("-N", "NNM-THIRDPARTY")
		k.ipt("-A", "NNM-THIRDPARTY", "-m", "comment", "--comment", "invalid-drop: looks like ours", "-j", "RETURN")
		k.ipt("-A", "INPUT", "-m", "comment", "--comment", "thirdparty", "-j", "NNM-THIRDPARTY")
		k.ipt("-t", "nat", "-N", "NNM-EMPTY")
		mustApply(t, k.backend(), invalidDrop(k.family), externalIP(k.family))
		plan, err := opsOf(k.backend()).CleanupPlan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(plan, "\n"); strings.Contains(text, "NNM-THIRDPARTY") || strings.Contains(text, "NNM-EMPTY") || !strings.Contains(text, "NNM-INVALID-INPUT") {
			t.Errorf("CleanupPlan = %q, want our chains only", text)
		}
		if _, err := opsOf(k.backend()).RemoveAll(ctx, k.family); err != nil {
			t.Fatal(err)
		}
		s := k.save()
		mustContain(t, s, ":NNM-THIRDPARTY", "-A INPUT -m comment --comment thirdparty -j NNM-THIRDPARTY", ":NNM-EMPTY")
		mustLack(t, s, "NNM-INVALID", "NNM-EXTIP")
		mustApply(t, k.backend(), invalidDrop(k.family))
		if err := k.backend().Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		s = k.save()
		mustContain(t, s, ":NNM-THIRDPARTY", ":NNM-EMPTY")
		mustLack(t, s, "NNM-INVALID")
	})
}
