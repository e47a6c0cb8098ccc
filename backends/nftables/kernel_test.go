package nftables

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/connlabel"
)

// These tests program a real kernel inside a network namespace of their own and assert on what
// `nft list` prints there. They skip without root.

func inNS(t *testing.T, ns *netns.NS, fn func() error) {
	t.Helper()
	if err := ns.Do(fn); err != nil {
		t.Fatal(err)
	}
}

func nftList(t *testing.T, ns *netns.NS, args ...string) string {
	t.Helper()
	return ns.MustExec(append([]string{"nft"}, args...)...)
}

// listTable is `nft list table` of one table in ns without the counters' values, which traffic
// moves: what two listings of the same rules compare equal on.
func listTable(t *testing.T, ns *netns.NS, f rules.Family, table string) string {
	t.Helper()
	return counterValues.ReplaceAllString(nftList(t, ns, "list", "table", string(nftFamily(f)), table), "")
}

// eachFamily runs fn as one subtest per family, each in a namespace of its own (prefix-<random>);
// it needs nft.
func eachFamily(t *testing.T, prefix string, fn func(t *testing.T, ns *netns.NS, f rules.Family)) {
	t.Helper()
	netns.Require(t, "nft")
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) { fn(t, netns.New(t, prefix), f) })
	}
}

// applyIn applies the rulesets in order with b inside ns; the first error fails the test.
func applyIn(ctx context.Context, t *testing.T, ns *netns.NS, b *Backend, rss ...*rules.Ruleset) {
	t.Helper()
	inNS(t, ns, func() error {
		for _, rs := range rss {
			if err := apply(ctx, b, rs); err != nil {
				return err
			}
		}
		return nil
	})
}

// foreign creates tables that belong to someone else: a kube-proxy-like nft table and an
// iptables-nft rule (which lives in nft table ip/ip6 filter).
func foreign(t *testing.T, ns *netns.NS, f rules.Family) (snapshot func() string) {
	t.Helper()
	nf, ipt, addr := "ip", "iptables", "10.96.0.1"
	if f == rules.IPv6 {
		nf, ipt, addr = "ip6", "ip6tables", "fd00:96::1"
	}
	ns.MustExec("nft", "add table "+nf+" kube-proxy")
	ns.MustExec("nft", "add chain "+nf+" kube-proxy services { type nat hook prerouting priority -100 ; }")
	ns.MustExec("nft", "add rule "+nf+" kube-proxy services "+nf+" daddr "+addr+" tcp dport 80 counter accept comment \"kube-proxy rule\"")
	ns.MustExec(ipt, "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-m", "comment", "--comment", "someone else", "-j", "ACCEPT")
	return func() string {
		save := ns.MustExec(ipt+"-save", "-t", "filter")
		save = regexp.MustCompile(`(?m)^#.*\n|\[\d+:\d+\]`).ReplaceAllString(save, "")
		return nftList(t, ns, "list", "table", nf, "kube-proxy") + save
	}
}

// sendUDP sends n datagrams from inside the namespace (call within ns.Do).
func sendUDP(addr string, n int) error {
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	// Unconnected, so the ICMP port-unreachable answers do not fail the next write.
	c, err := net.ListenUDP("udp", nil)
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < n; i++ {
		if _, err := c.WriteToUDP([]byte("probe"), to); err != nil {
			return err
		}
	}
	return nil
}

var counterValues = regexp.MustCompile(`packets \d+ bytes \d+`)

func TestKernel(t *testing.T) {
	netns.Require(t, "nft", "iptables", "ip6tables")
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) { testKernel(t, f) })
	}
}

// kt is the state the phases of testKernel share.
type kt struct {
	t        *testing.T
	ctx      context.Context
	ns       *netns.NS
	f        rules.Family
	nf       string
	k        *kernel
	b        *Backend
	inv      *rules.Ruleset
	misc     *rules.Ruleset
	extTable string
}

func testKernel(t *testing.T, f rules.Family) {
	ctx := context.Background()
	ns := netns.New(t, "nnm-nft")
	foreignState := foreign(t, ns, f)
	before := foreignState()
	nf := string(nftFamily(f))

	k := newRealKernel()
	b := k.backend(t)
	ext := externalIPRuleset(f, threeEntries(f))
	inv := invalidDropRuleset(f)
	misc := miscRuleset(f)
	extTable := TableName(ext.Fix)

	// Every golden ruleset is accepted by the real nft and kernel.
	inNS(t, ns, func() error {
		for _, rs := range []*rules.Ruleset{ext, inv, misc, clampRuleset(f)} {
			if err := apply(ctx, b, rs); err != nil {
				return err
			}
		}
		return nil
	})
	listing := nftList(t, ns, "list", "table", nf, extTable)
	label, err := connlabel.Bit(ext.Fix, "external-ips")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"type nat hook prerouting priority dstnat - 10; policy accept;",
		"type nat hook postrouting priority srcnat + 10; policy accept;",
		`comment "ns1/svc1:udp-53" : ` + addrs(f, "10.96.0.2", "fd00:96::2") + " . 53",
		`counter name "cnt-dnat" meta mark set meta mark | 0x00004000 ct label set ` + strconv.Itoa(label) + ` dnat ` + nf + ` to ` + nf + ` daddr . meta l4proto . th dport map @external-ips comment "external IP to cluster IP"`,
		// the masquerade's lookup by original destination is the label the DNAT set
		`ct status dnat ct label ` + strconv.Itoa(label) + ` masquerade comment "masquerade by conntrack"`,
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("kernel listing lacks %q:\n%s", want, listing)
		}
	}
	if l := nftList(t, ns, "list", "table", nf, "nnm-clamp"); !strings.Contains(l, "type filter hook forward priority mangle - 10; policy accept;") ||
		!strings.Contains(l, `tcp flags syn / syn,rst counter name "cnt-from-pods" tcp option maxseg size set rt mtu`) ||
		!strings.Contains(l, `oifname "cali*" tcp dport 443 tcp flags syn / syn,rst tcp option maxseg size set 1300`) {
		t.Errorf("clamp table:\n%s", l)
	}
	if l := nftList(t, ns, "list", "table", nf, "nnm-invalid-drop"); !strings.Contains(l, `ct state invalid counter name "cnt-invalid-dropped" drop comment "network-node-manager:invalid-drop"`) {
		t.Errorf("invalid-drop table:\n%s", l)
	}
	x := &kt{t: t, ctx: ctx, ns: ns, f: f, nf: nf, k: k, b: b, inv: inv, misc: misc, extTable: extTable}
	rec, changed := x.mapChange()
	x.counters()
	x.tamper(rec, changed)
	x.remove(foreignState, before)
}

// mapChange: re-applying sends nothing; a map-only change sends element operations only.
func (x *kt) mapChange() (*recorder, []rules.MapEntry) {
	t, ctx, ns, f, nf, k, b, extTable := x.t, x.ctx, x.ns, x.f, x.nf, x.k, x.b, x.extTable
	// Re-applying leaves the ruleset byte-identical and sends nothing.
	rec := k.rec(nftFamily(f), extTable)
	ruleset := nftList(t, ns, "-a", "list", "ruleset")
	n := rec.count()
	inNS(t, ns, func() error { return apply(ctx, b, externalIPRuleset(f, threeEntries(f))) })
	if sent := rec.sentSince(n); len(sent) != 0 {
		t.Fatalf("re-apply sent %q", sent)
	}
	if got := nftList(t, ns, "-a", "list", "ruleset"); got != ruleset {
		t.Fatalf("re-apply changed the ruleset:\n%s\nwas:\n%s", got, ruleset)
	}

	// A map-only change sends only element operations and the kernel shows the new elements.
	changed := threeEntries(f)[1:]
	changed[1].To = netip.AddrPortFrom(changed[1].To.Addr().Next(), 5353)
	changed = append(changed, entry(f, 9, rules.TCP, 8080, 80))
	inNS(t, ns, func() error { return apply(ctx, b, externalIPRuleset(f, changed)) })
	sent := rec.sentSince(n)
	if len(sent) != 1 {
		t.Fatalf("map change sent %d transactions", len(sent))
	}
	if err := onlyElementOps(sent[0]); err != nil {
		t.Fatalf("%v\n%s", err, sent[0])
	}
	m := nftList(t, ns, "list", "map", nf, extTable, "external-ips")
	for _, want := range []string{
		addrs(f, "203.0.113.10 . tcp . 8080", "2001:db8:113::a . tcp . 8080"),
		addrs(f, "10.96.0.3 . 5353", "fd00:96::3 . 5353"),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("map lacks %q:\n%s", want, m)
		}
	}
	if strings.Contains(m, " . tcp . 80 ") {
		t.Errorf("removed element still in the map:\n%s", m)
	}
	inNS(t, ns, func() error {
		if ok, err := inSync(ctx, b, externalIPRuleset(f, changed)); !ok || err != nil {
			return fmt.Errorf("in sync after element change = %v, %v", ok, err)
		}
		return nil
	})
	return rec, changed
}

// counters: named counters read real packets and survive a full rewrite of the table.
func (x *kt) counters() {
	t, ctx, ns, f, b, inv := x.t, x.ctx, x.ns, x.f, x.b, x.inv
	// Counters read real packets, and survive a full rewrite of the table.
	const probe = 5
	inNS(t, ns, func() error { return sendUDP(addrs(f, "127.0.0.2:9999", "[::1]:9999"), probe) })
	readProbe := func() uint64 {
		var got uint64
		inNS(t, ns, func() error {
			c, err := b.Counters(ctx, inv.Fix, f)
			got = c["probe"].Packets
			return err
		})
		return got
	}
	if got := readProbe(); got != probe {
		t.Fatalf("probe counter = %d packets, want %d", got, probe)
	}
	inv2 := invalidDropRuleset(f)
	inv2.Chains[1].Rules = append(inv2.Chains[1].Rules, rules.Rule{Match: rules.Match{Protocol: rules.TCP, DstPort: 1}, Verdict: rules.Verdict{Kind: rules.Accept}})
	inNS(t, ns, func() error { return apply(ctx, b, inv2) })
	if got := readProbe(); got != probe {
		t.Fatalf("after a rewrite the probe counter = %d packets, want %d (named counters must survive)", got, probe)
	}
}

// tamper: changes behind our back are found by Verify and restored; a rejected transaction changes
// nothing.
func (x *kt) tamper(rec *recorder, changed []rules.MapEntry) {
	t, ctx, ns, f, nf, b, extTable := x.t, x.ctx, x.ns, x.f, x.nf, x.b, x.extTable
	// Changes behind our back: a Verify reconcile notices and restores.
	want := nftList(t, ns, "list", "table", nf, extTable)
	for name, tamper := range map[string][]string{
		"flush chain":    {"flush chain " + nf + " " + extTable + " extip-dnat"},
		"flush table":    {"flush table " + nf + " " + extTable},
		"delete element": {"delete element " + nf + " " + extTable + " external-ips { " + addrs(f, "203.0.113.10", "2001:db8:113::a") + " . tcp . 8080 }"},
		"delete table":   {"delete table " + nf + " " + extTable},
		"delete key":     {"delete element " + nf + " " + extTable + " " + keySetName("external-ips") + " { " + addrs(f, "203.0.113.10", "2001:db8:113::a") + " . tcp . 8080 }"},
	} {
		for _, cmd := range tamper {
			ns.MustExec("nft", cmd)
		}
		inNS(t, ns, func() error {
			if ok, err := inSync(ctx, b, externalIPRuleset(f, changed)); ok || err != nil {
				return fmt.Errorf("%s: Verify found the table in sync (%v, %v)", name, ok, err)
			}
			if ok, err := inSync(ctx, b, externalIPRuleset(f, changed)); !ok || err != nil {
				return fmt.Errorf("%s: in sync after repair = %v, %v", name, ok, err)
			}
			return nil
		})
		got := nftList(t, ns, "list", "table", nf, extTable)
		if counterValues.ReplaceAllString(got, "") != counterValues.ReplaceAllString(want, "") {
			t.Fatalf("%s: Apply did not restore the table:\n%s\nwant:\n%s", name, got, want)
		}
	}

	// A transaction the kernel rejects changes nothing and the error names the cause.
	want = nftList(t, ns, "list", "ruleset")
	rec.inject = func(tx *knftables.Transaction) error {
		tx.Add(&knftables.Rule{Chain: "extip-dnat", Rule: "meta mark set 0x1 frobnicate"})
		return nil
	}
	inNS(t, ns, func() error {
		err := apply(ctx, b, externalIPRuleset(f, threeEntries(f)))
		if err == nil || !strings.Contains(err.Error(), "frobnicate") || !strings.Contains(err.Error(), extTable) {
			return fmt.Errorf("Apply of a rejected transaction returned %v", err)
		}
		return nil
	})
	rec.inject = nil
	if got := nftList(t, ns, "list", "ruleset"); got != want {
		t.Fatalf("a rejected transaction changed the kernel:\n%s\nwant:\n%s", got, want)
	}
}

// remove: Remove deletes one table, CleanupPlan names ours, Cleanup deletes them; foreign tables stay.
func (x *kt) remove(foreignState func() string, before string) {
	t, ctx, ns, f, nf, b, misc := x.t, x.ctx, x.ns, x.f, x.nf, x.b, x.misc
	// Remove deletes one table; Cleanup every nnm-* table; the foreign ones stay.
	inNS(t, ns, func() error { return remove(ctx, b, misc.Fix, f) })
	if tables := nftList(t, ns, "list", "tables"); strings.Contains(tables, "nnm-misc") || !strings.Contains(tables, "nnm-invalid-drop") {
		t.Fatalf("after Remove:\n%s", tables)
	}
	// CleanupPlan (cleanup --dry-run) names the nnm-* tables, not the foreign ones, and changes nothing.
	tablesBefore := nftList(t, ns, "list", "tables")
	inNS(t, ns, func() error {
		plan, err := opsOf(b).CleanupPlan(ctx)
		if err != nil {
			return err
		}
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "nftables: table "+nf+" nnm-invalid-drop") || strings.Contains(text, "kube-proxy") {
			return fmt.Errorf("CleanupPlan = %q, want the nnm-* tables of %s only", text, nf)
		}
		return nil
	})
	if tables := nftList(t, ns, "list", "tables"); tables != tablesBefore {
		t.Fatalf("CleanupPlan changed the tables:\n%s\nwas:\n%s", tables, tablesBefore)
	}
	inNS(t, ns, func() error { return b.Cleanup(ctx) })
	if tables := nftList(t, ns, "list", "tables"); strings.Contains(tables, "nnm-") {
		t.Fatalf("Cleanup left:\n%s", tables)
	}
	if after := foreignState(); counterValues.ReplaceAllString(after, "") != counterValues.ReplaceAllString(before, "") {
		t.Fatalf("someone else's rules changed:\n%s\nwas:\n%s", after, before)
	}
}

// TestKernelCost logs what the parts of an Apply cost with a map of 10,000 elements (run with -v;
// BenchmarkApply10k gives averaged numbers) and checks the no-op and element paths are taken.
func TestKernelCost(t *testing.T) {
	netns.Require(t, "nft")
	ns := netns.New(t, "nnm-nft")
	k := newRealKernel()
	b := k.backend(t)
	ctx := context.Background()
	f := rules.IPv4
	rs := externalIPRuleset(f, manyEntries(f, 10000))
	text, err := b.Render(rs)
	if err != nil {
		t.Fatal(err)
	}
	timed := func(what string, fn func() error) {
		t.Helper()
		start := time.Now()
		inNS(t, ns, fn)
		t.Logf("%-45s %v", what, time.Since(start).Round(time.Millisecond))
	}
	timed("nft -f of the rendered 10k transaction", func() error {
		cmd := exec.Command("nft", "-f", "-")
		cmd.Stdin = strings.NewReader(text)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	ns.MustExec("nft", "delete", "table", "ip", TableName(rs.Fix))
	timed("cold Apply (new interface, tx, read-back)", func() error { return apply(ctx, b, rs) })
	timed("Verify, generation unchanged", func() error {
		if ok, err := inSync(ctx, b, rs); !ok || err != nil {
			return fmt.Errorf("in sync = %v, %v", ok, err)
		}
		return nil
	})
	ns.MustExec("nft", "add table ip someone-else")
	timed("Verify, generation changed (lists our table)", func() error {
		if ok, err := inSync(ctx, b, rs); !ok || err != nil {
			return fmt.Errorf("in sync = %v, %v", ok, err)
		}
		return nil
	})
	rec := k.rec(nftFamily(f), TableName(rs.Fix))
	n := rec.count()
	timed("no-op Apply", func() error { return apply(ctx, b, externalIPRuleset(f, manyEntries(f, 10000))) })
	if sent := rec.sentSince(n); len(sent) != 0 {
		t.Fatalf("no-op Apply sent %d transactions", len(sent))
	}
	changed := append(manyEntries(f, 10000)[1:], entry(f, 20000, rules.UDP, 53, 53))
	timed("one-element Apply", func() error { return apply(ctx, b, externalIPRuleset(f, changed)) })
	if sent := rec.sentSince(n); len(sent) != 1 || onlyElementOps(sent[0]) != nil {
		t.Fatalf("one-element Apply sent %q", sent)
	}
	rs2 := externalIPRuleset(f, changed)
	rs2.Chains[0].Rules = rs2.Chains[0].Rules[:1]
	timed("rule-change Apply (full rewrite)", func() error { return apply(ctx, b, rs2) })
}

func manyEntries(f rules.Family, n int) []rules.MapEntry {
	out := make([]rules.MapEntry, n)
	for i := range out {
		out[i] = entry(f, i, rules.TCP, uint16(80+i%3), 8080)
	}
	return out
}

func BenchmarkApply10k(b *testing.B) {
	netns.Require(b, "nft")
	ns := netns.New(b, "nnm-nft")
	ctx := context.Background()
	for _, f := range rules.Families {
		entries := manyEntries(f, 10000)
		one := append(manyEntries(f, 10000)[:9999], entry(f, 20000, rules.UDP, 53, 53))
		b.Run("cold-"+string(f), func(b *testing.B) {
			be := newRealKernel().backend(b)
			if err := ns.Do(func() error {
				rs := externalIPRuleset(f, entries)
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					if err := remove(ctx, be, rs.Fix, f); err != nil {
						return err
					}
					b.StartTimer()
					if err := apply(ctx, be, rs); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		})
		// Every entry replaced by another: 40,000 element operations in bounded transactions, with
		// the most heap (live and garbage, GOGC=5) the change held at once above what was in use.
		b.Run("replace-all-"+string(f), func(b *testing.B) {
			be := newRealKernel().backend(b)
			opsOf(be).sendElements = sendElementDiff
			others := make([]rules.MapEntry, len(entries))
			for i := range others {
				others[i] = entry(f, 20000+i, rules.TCP, uint16(80+i%3), 8080)
			}
			defer debug.SetGCPercent(debug.SetGCPercent(5))
			var peak float64
			if err := ns.Do(func() error {
				if err := apply(ctx, be, externalIPRuleset(f, entries)); err != nil {
					return err
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					rs := externalIPRuleset(f, others)
					if i%2 == 1 {
						rs = externalIPRuleset(f, entries)
					}
					var err error
					peak = max(peak, heapGrowth(func() { err = apply(ctx, be, rs) }))
					if err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(peak/1e6, "peak-heap-MB")
		})
		b.Run("one-element-"+string(f), func(b *testing.B) {
			be := newRealKernel().backend(b)
			if err := ns.Do(func() error {
				if err := apply(ctx, be, externalIPRuleset(f, entries)); err != nil {
					return err
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					e := entries
					if i%2 == 0 {
						e = one
					}
					if err := apply(ctx, be, externalIPRuleset(f, e)); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestKernelGeneration: a Verify reconcile with the nf_tables generation unchanged since our last
// commit lists nothing; a commit by someone else anywhere moves the generation, and the next Verify
// lists our table alone; a foreign change inside our table is found that way and repaired.
func TestKernelGeneration(t *testing.T) {
	eachFamily(t, "nnm-nft", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		nf := string(nftFamily(f))
		k := newRealKernel()
		b := k.backend(t)
		ext := externalIPRuleset(f, threeEntries(f))
		inv := invalidDropRuleset(f)
		applyIn(ctx, t, ns, b, ext, inv)
		recs := []*recorder{k.rec(nftFamily(f), TableName(ext.Fix)), k.rec(nftFamily(f), TableName(inv.Fix))}
		lists := func() int { return recs[0].listCount() + recs[1].listCount() }
		sent := func() int { return recs[0].count() + recs[1].count() }
		round := func() (repaired []string, listed, sends int) {
			t.Helper()
			l0, s0 := lists(), sent()
			inNS(t, ns, func() error {
				for _, rs := range []*rules.Ruleset{ext, inv} {
					res, err := verify(ctx, b, rs)
					if err != nil {
						return err
					}
					if res.Repaired {
						repaired = append(repaired, rs.Fix)
					}
				}
				return nil
			})
			return repaired, lists() - l0, sent() - s0
		}
		// ext was applied before inv's commit moved the generation: the first round lists ext
		// once; from then on the generation proves both unchanged.
		round()
		for i := range 3 {
			if rep, listed, sends := round(); len(rep) != 0 || listed != 0 || sends != 0 {
				t.Fatalf("round %d with the generation unchanged: repaired %v, %d listings, %d transactions; want none", i, rep, listed, sends)
			}
		}
		// Someone else commits elsewhere: the generation moves, our tables are listed, and
		// found as they were.
		ns.MustExec("nft", "add table "+nf+" someone-else")
		if rep, listed, sends := round(); len(rep) != 0 || listed == 0 || sends != 0 {
			t.Fatalf("after a foreign commit elsewhere: repaired %v, %d listings, %d transactions; want listings only", rep, listed, sends)
		}
		if rep, listed, _ := round(); len(rep) != 0 || listed != 0 {
			t.Fatalf("after confirming: repaired %v, %d listings; want none", rep, listed)
		}
		// Someone empties our map: found and repaired, the other table untouched.
		want := listTable(t, ns, f, TableName(ext.Fix))
		ns.MustExec("nft", "flush map "+nf+" "+TableName(ext.Fix)+" external-ips")
		if rep, _, _ := round(); !slices.Equal(rep, []string{ext.Fix}) {
			t.Fatalf("after flushing our map: repaired %v, want [%s]", rep, ext.Fix)
		}
		if got := listTable(t, ns, f, TableName(ext.Fix)); got != want {
			t.Fatalf("repair did not restore the table:\n%s\nwant:\n%s", got, want)
		}
		if rep, listed, sends := round(); len(rep) != 0 || listed != 0 || sends != 0 {
			t.Fatalf("after the repair: repaired %v, %d listings, %d transactions; want none", rep, listed, sends)
		}
	})
}

// A table left by an agent from before the companion sets (its rules test membership on the map
// itself, which kernels from 6.3 accept) is rewritten by a fresh agent into exactly what a cold
// apply makes.
func TestKernelUpgradeFromMapLookup(t *testing.T) {
	ctx := context.Background()
	eachFamily(t, "nnm-nft", func(t *testing.T, ns *netns.NS, f rules.Family) {
		rs := externalIPRuleset(f, threeEntries(f))
		table, nf := TableName(rs.Fix), string(nftFamily(f))
		text, err := (&Ops{}).Render(rs)
		if err != nil {
			t.Fatal(err)
		}
		set := keySetName("external-ips")
		var old []string
		for _, line := range strings.Split(text, "\n") {
			if !strings.Contains(line, " "+set) {
				old = append(old, strings.ReplaceAll(line, "@"+set, "@external-ips"))
			}
		}
		ns.NftLoad(strings.Join(old, "\n"))
		was := nftList(t, ns, "list", "table", nf, table)
		if strings.Contains(was, set) || !strings.Contains(was, "@external-ips jump") {
			t.Fatalf("the old layout did not load as such:\n%s", was)
		}

		applyIn(ctx, t, ns, newRealKernel().backend(t), rs)
		got := listTable(t, ns, f, table)
		ns.MustExec("nft", "delete", "table", nf, table)
		applyIn(ctx, t, ns, newRealKernel().backend(t), rs)
		if want := listTable(t, ns, f, table); got != want {
			t.Fatalf("after the upgrade:\n%s\nwant (cold apply):\n%s", got, want)
		}
		t.Logf("%s: old layout rewritten; the table now tests membership on %s", f, set)
	})
}

// TestKernelReadsOverNetlink: the backend as the agent builds it (New with zero Options) reads its
// tables back over netlink. A backend made after PATH was emptied has no nft to run at all (the first
// one's cached interfaces know nft's absolute path): it reads the real packet count in a scrape, and
// lists the map with its elements exactly as the model renders them. The first backend's Verify after
// someone else's commit (so the generation moved and the tables must be listed, elements included)
// finds both tables in sync. The lister itself: a missing table is isNotFound, anonymous sets are not
// objects of ours.
func TestKernelReadsOverNetlink(t *testing.T) {
	eachFamily(t, "nnm-rd", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		b, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		ext, inv := externalIPRuleset(f, threeEntries(f)), invalidDropRuleset(f)
		applyIn(ctx, t, ns, b, ext, inv)
		const probe = 3
		inNS(t, ns, func() error { return sendUDP(addrs(f, "127.0.0.2:9999", "[::1]:9999"), probe) })
		nf := string(nftFamily(f))
		ns.MustExec("nft", "add table "+nf+" someone-else")
		ns.MustExec("nft", "add table "+nf+" nnm-anon")
		ns.MustExec("nft", "add chain "+nf+" nnm-anon c")
		ns.MustExec("nft", "add rule "+nf+" nnm-anon c "+addrs(f, "ip daddr { 192.0.2.1, 192.0.2.2 }", "ip6 daddr { 2001:db8::1, 2001:db8::2 }")+" drop")

		t.Setenv("PATH", t.TempDir())
		fresh, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		inNS(t, ns, func() error {
			c, err := fresh.Counters(ctx, inv.Fix, f)
			if err != nil {
				return err
			}
			if got := c["probe"].Packets; got != probe {
				return fmt.Errorf("probe counter over netlink = %d packets, want %d", got, probe)
			}
			k, err := keyOf(ext.Fix, f)
			if err != nil {
				return err
			}
			r, err := opsOf(fresh).reader(k)
			if err != nil {
				return err
			}
			listed, err := snapshot(ctx, r, true)
			if err != nil {
				return fmt.Errorf("list %s without nft: %w", k.table, err)
			}
			m, err := build(ext)
			if err != nil {
				return err
			}
			if want := (&tableState{}).withElements(m); !listed.sameElements(want) {
				return fmt.Errorf("elements listed over netlink:\n%v\nwant (the model):\n%v", listed.elements, want.elements)
			}
			for _, rs := range []*rules.Ruleset{ext, inv} {
				res, err := b.Reconcile(ctx, rs.Fix, f, rs, backend.Verify)
				if err != nil {
					return fmt.Errorf("verify %s without nft: %w", rs.Fix, err)
				}
				if !res.ReadBack || res.Applied || res.Repaired {
					return fmt.Errorf("verify %s after a foreign commit = %+v, want listed and in sync", rs.Fix, res)
				}
			}
			l, err := newNetlinkLister(nftFamily(f), "nnm-anon")
			if err != nil {
				return err
			}
			all, err := l.ListAll(ctx)
			if err != nil {
				return err
			}
			if len(all["set"])+len(all["map"]) != 0 || !slices.Equal(all["chain"], []string{"c"}) {
				return fmt.Errorf("nnm-anon lists %v, want chain c and no set (the rule's set is anonymous)", all)
			}
			missing, err := newNetlinkLister(nftFamily(f), "nnm-missing")
			if err != nil {
				return err
			}
			if _, err := missing.ListAll(ctx); !isNotFound(err) {
				return fmt.Errorf("listing a missing table: %v, want a not-found error", err)
			}
			if c, err := b.Counters(ctx, "absent-fix", f); err != nil || len(c) != 0 {
				return fmt.Errorf("counters of a fix without a table = %v, %v; want none, no error", c, err)
			}
			return nil
		})
	})
}

// TestKernelInterferenceBeforeReadBack: someone flushes our table right after our transaction,
// before the backend lists it back for its record (see the iptables test of that name). The listing
// must not become the record: Verify would then find the empty chains matching. The Driver applies
// again, and the table is what an undisturbed apply makes.
func TestKernelInterferenceBeforeReadBack(t *testing.T) {
	eachFamily(t, "nnm-nft", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		nf := string(nftFamily(f))
		inv := invalidDropRuleset(f)
		table := TableName(inv.Fix)
		applyIn(ctx, t, ns, newRealKernel().backend(t), inv)
		want := listTable(t, ns, f, table)
		ns.MustExec("nft", "delete table "+nf+" "+table)

		k := newRealKernel()
		b := k.backend(t)
		rec := k.rec(nftFamily(f), table)
		flushed := false
		rec.setAfter(func() {
			rec.setAfter(nil)
			ns.MustExec("nft", "flush table "+nf+" "+table)
			flushed = true
		})
		applyIn(ctx, t, ns, b, inv)
		if !flushed {
			t.Fatal("no transaction ran")
		}
		if got := listTable(t, ns, f, table); got != want {
			t.Fatalf("after a flush between our transaction and its read-back:\n%s\nwant:\n%s", got, want)
		}
		ns.MustExec("nft", "add table "+nf+" someone-else") // moves the generation: Verify lists
		inNS(t, ns, func() error {
			res, err := verify(ctx, b, inv)
			if err == nil && res.Repaired {
				err = fmt.Errorf("Verify repaired %+v: the record was not the kernel", res)
			}
			return err
		})
	})
}

// heapGrowth runs fn and returns the most heap (in use: live objects and garbage not yet swept)
// it held at once above what was in use before, sampled every 0.2 ms.
func heapGrowth(fn func()) float64 {
	const name = "/memory/classes/heap/objects:bytes"
	read := func() uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	runtime.GC()
	base := read()
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	fn()
	close(stop)
	<-done
	if p := peak.Load(); p > base {
		return float64(p - base)
	}
	return 0
}
