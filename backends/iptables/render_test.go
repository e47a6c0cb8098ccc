package iptables

// Test address plan (documentation ranges only):
//
//	pod CIDRs            10.244.0.0/16, 10.245.0.0/16   fd00:244::/56
//	external IPs (LB)    203.0.113.10, 203.0.113.11    2001:db8:ff::10
//	cluster IPs          10.96.0.10, 10.96.0.11        fd00:96::10
//	foreign test ports   7777 (counted), 9999
//	sharded external IPs 198.51.100.7, 203.0.113.200, 203.0.113.5  2001:db8:ff::10, 2001:db8:ff::1:5
//	                     (three /28 buckets in IPv4, two /124 buckets in IPv6)

import (
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// golden compares got with testdata/<name>.golden (testkit.Golden; -update rewrites it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	testkit.Golden(t, filepath.Join("testdata", name+".golden"), got)
}

func mustBackend(t testing.TB, opts Options) *Backend {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// byFamily picks the IPv4 or the IPv6 variant of a test value.
func byFamily[T any](f rules.Family, v4, v6 T) T {
	if f == rules.IPv4 {
		return v4
	}
	return v6
}

func invalidDrop(family rules.Family) *rules.Ruleset {
	return &rules.Ruleset{Fix: "invalid-drop", Family: family, Chains: []rules.Chain{{
		Name: "INVALID-INPUT", Type: rules.Filter, Hook: rules.Input,
		Rules: []rules.Rule{{
			Match:   rules.Match{CTStates: []rules.CTState{rules.CTInvalid}},
			Verdict: rules.Verdict{Kind: rules.Drop},
			Counter: "dropped",
			Comment: "drop INVALID so the node sends no RST",
		}},
	}}}
}

func externalIP(family rules.Family) *rules.Ruleset {
	v4 := family == rules.IPv4
	ip := netip.MustParseAddr
	var pods []netip.Prefix
	var entries []rules.MapEntry
	if v4 {
		pods = []netip.Prefix{netip.MustParsePrefix("10.245.0.0/16"), netip.MustParsePrefix("10.244.0.0/16")}
		entries = []rules.MapEntry{
			{Addr: ip("203.0.113.11"), Protocol: rules.UDP, Port: 53, To: netip.AddrPortFrom(ip("10.96.0.11"), 53), Comment: "kube-system/dns:dns"},
			{Addr: ip("203.0.113.10"), Protocol: rules.TCP, Port: 443, To: netip.AddrPortFrom(ip("10.96.0.10"), 443), Comment: `default/web:"https"`},
			{Addr: ip("203.0.113.10"), Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(ip("10.96.0.10"), 80), Comment: "default/web:http"},
			{Addr: ip("203.0.113.10"), Protocol: rules.SCTP, Port: 9999, To: netip.AddrPortFrom(ip("10.96.0.10"), 9999), Comment: "default/web:sctp"},
		}
	} else {
		pods = []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}
		entries = []rules.MapEntry{
			{Addr: ip("2001:db8:ff::10"), Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(ip("fd00:96::10"), 80), Comment: "default/web:http"},
			{Addr: ip("2001:db8:ff::10"), Protocol: rules.UDP, Port: 53, To: netip.AddrPortFrom(ip("fd00:96::10"), 53), Comment: "default/web:dns"},
		}
	}
	const mark = 0x8000
	return &rules.Ruleset{Fix: "ipvs-externalip-dnat", Family: family,
		Maps: []rules.Map{{Name: "external-ips", Entries: entries}},
		Chains: []rules.Chain{
			{Name: "EXTIP-PREROUTING", Type: rules.NAT, Hook: rules.Prerouting, Precedes: []string{"KUBE-SERVICES"}, Rules: []rules.Rule{
				{Match: rules.Match{SrcPrefixes: pods}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}, Comment: "from local pods"},
				{Match: rules.Match{InInterfacePrefix: "cali"}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}, Comment: "from pod interfaces"},
			}},
			{Name: "EXTIP-OUTPUT", Type: rules.NAT, Hook: rules.Output, Precedes: []string{"KUBE-SERVICES"}, Rules: []rules.Rule{
				{Match: rules.Match{SrcAddrType: rules.Local}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}, Comment: "host network"},
			}},
			{Name: "EXTIP-DNAT", Type: rules.NAT, Rules: []rules.Rule{
				{SetMark: mark, Comment: "mark for masquerade"},
				{Match: rules.Match{Lookup: "external-ips"}, Verdict: rules.Verdict{Kind: rules.DNATLookup}, Counter: "dnat"},
				{ClearMark: mark, Comment: "not DNATed"},
			}},
			{Name: "EXTIP-MASQ", Type: rules.NAT, Hook: rules.Postrouting, Rules: []rules.Rule{
				{Match: rules.Match{Mark: mark}, Verdict: rules.Verdict{Kind: rules.Masquerade}, Counter: "masqueraded", Comment: "masquerade what we DNATed"},
			}},
		}}
}

// externalIPSharded is externalIP with map entries in two lookup buckets per family, listed out of
// order, plus a second run of lookup rules in the same chain (its own buckets) behind a plain rule.
func externalIPSharded(family rules.Family) *rules.Ruleset {
	rs := externalIP(family)
	e := func(a, to string, port uint16, c string) rules.MapEntry {
		return rules.MapEntry{Addr: netip.MustParseAddr(a), Protocol: rules.TCP, Port: port, To: netip.AddrPortFrom(netip.MustParseAddr(to), port), Comment: c}
	}
	if family == rules.IPv4 {
		rs.Maps[0].Entries = []rules.MapEntry{
			e("203.0.113.200", "10.96.0.12", 443, "default/b:https"),
			e("198.51.100.7", "10.96.0.13", 80, "default/c:http"),
			e("203.0.113.5", "10.96.0.11", 80, "default/a:http"),
		}
	} else {
		rs.Maps[0].Entries = []rules.MapEntry{
			e("2001:db8:ff::1:5", "fd00:96::12", 443, "default/b:https"),
			e("2001:db8:ff::10", "fd00:96::10", 80, "default/a:http"),
		}
	}
	dnat := &rs.Chains[2]
	dnat.Rules = append(dnat.Rules,
		rules.Rule{Match: rules.Match{Protocol: rules.UDP}, Verdict: rules.Verdict{Kind: rules.Return}, Comment: "udp is not ours"},
		rules.Rule{Match: rules.Match{Lookup: "external-ips", SrcAddrType: rules.Local}, SetMark: 0x4000_0000, Comment: "second run, marked per entry"},
		rules.Rule{Match: rules.Match{Lookup: "external-ips", SrcAddrType: rules.Local}, Verdict: rules.Verdict{Kind: rules.DNATLookup}, Comment: "second run"},
	)
	// A lookup by the connection's original destination (issue #41: masquerade what was DNATed
	// without a mark): one rule matching the label that the map's DNAT rules set.
	masq := &rs.Chains[3]
	masq.Rules = append(masq.Rules, rules.Rule{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: "external-ips", LookupKey: rules.LookupCTOriginal},
		Verdict: rules.Verdict{Kind: rules.Masquerade}, Comment: "masquerade by conntrack"})
	return rs
}

// kitchenSink covers every match and verdict once.
func kitchenSink(family rules.Family) *rules.Ruleset {
	addr := func(a4, a6 string) netip.Addr { return netip.MustParseAddr(byFamily(family, a4, a6)) }
	pfx := func(a4, a6 string) netip.Prefix { return netip.MustParsePrefix(byFamily(family, a4, a6)) }
	return &rules.Ruleset{Fix: "kitchen-sink", Family: family, Chains: []rules.Chain{
		{Name: "SINK-FORWARD", Type: rules.Filter, Hook: rules.Forward, Rules: []rules.Rule{
			{Match: rules.Match{Protocol: rules.TCP, DstPort: 22, DstAddr: addr("192.0.2.1", "2001:db8::1")}, Verdict: rules.Verdict{Kind: rules.Accept}, Comment: `it's "quoted" \ and	tabbed`},
			{Match: rules.Match{Protocol: rules.UDP, DstPort: 53}, Verdict: rules.Verdict{Kind: rules.Return}},
			{Match: rules.Match{Protocol: rules.SCTP}, Verdict: rules.Verdict{Kind: rules.Drop}, Comment: "any sctp"},
			{Match: rules.Match{CTStates: []rules.CTState{rules.CTNew, rules.CTRelated}, Mark: 0x1}, SetMark: 0x2, Verdict: rules.Verdict{Kind: rules.Accept}, Counter: "new-marked"},
			{Match: rules.Match{SrcPrefixes: []netip.Prefix{pfx("198.51.100.7/24", "2001:db8:1::7/64")}}, Counter: "seen"},
			{Match: rules.Match{Mark: 0x2}, ClearMark: 0x1, Comment: "clear a bit"},
		}},
		{Name: "SINK-DNAT", Type: rules.NAT, Hook: rules.Prerouting, Rules: []rules.Rule{
			{Match: rules.Match{DstAddr: addr("192.0.2.2", "2001:db8::2"), Protocol: rules.TCP, DstPort: 80}, Verdict: rules.Verdict{Kind: rules.DNAT, To: netip.AddrPortFrom(addr("10.96.0.10", "fd00:96::10"), 8080)}},
			{Match: rules.Match{DstAddr: addr("192.0.2.3", "2001:db8::3")}, Verdict: rules.Verdict{Kind: rules.DNAT, To: netip.AddrPortFrom(addr("10.96.0.11", "fd00:96::11"), 0)}},
		}},
	}}
}

// mssClamp covers the mangle table, destination prefixes, output interfaces, TCP flags and both
// forms of the MSS clamp.
func mssClamp(family rules.Family) *rules.Ruleset {
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.245.0.0/16")}
	if family == rules.IPv6 {
		pods = []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}
	}
	syn := func(m rules.Match) rules.Match { m.Protocol, m.TCPFlags = rules.TCP, rules.SYNNotRST; return m }
	return &rules.Ruleset{Fix: "mss-clamp", Family: family, Chains: []rules.Chain{
		{Name: "CLAMP-FORWARD", Type: rules.Mangle, Hook: rules.Forward, Rules: []rules.Rule{
			{Match: syn(rules.Match{SrcPrefixes: pods}), Verdict: rules.Verdict{Kind: rules.ClampMSS}, Counter: "from-pods"},
			{Match: syn(rules.Match{DstPrefixes: pods}), Verdict: rules.Verdict{Kind: rules.ClampMSS}, Counter: "to-pods"},
			{Match: syn(rules.Match{InInterfacePrefix: "cali"}), Verdict: rules.Verdict{Kind: rules.ClampMSS, MSS: 1300}},
			{Match: syn(rules.Match{OutInterfacePrefix: "cali", DstPort: 443}), Verdict: rules.Verdict{Kind: rules.ClampMSS, MSS: 1300}, Comment: "fixed"},
			{Match: rules.Match{Protocol: rules.TCP, TCPFlags: rules.TCPFlags{Mask: rules.FIN | rules.SYN | rules.RST | rules.ACK}}, Verdict: rules.Verdict{Kind: rules.Drop}, Comment: "null scan"},
		}},
	}}
}

func TestRenderGolden(t *testing.T) {
	b := mustBackend(t, Options{Variant: NFT})
	for _, tc := range []struct {
		name string
		rs   func(rules.Family) *rules.Ruleset
	}{
		{"invalid-drop", invalidDrop},
		{"externalip", externalIP},
		{"kitchen-sink", kitchenSink},
		{"externalip-sharded", externalIPSharded},
		{"mss-clamp", mssClamp},
	} {
		for _, f := range rules.Families {
			t.Run(tc.name+"-"+string(f), func(t *testing.T) {
				got, err := b.Render(tc.rs(f))
				if err != nil {
					t.Fatal(err)
				}
				golden(t, tc.name+"-"+string(f), got)
				again, _ := b.Render(tc.rs(f))
				if again != got {
					t.Error("Render is not deterministic")
				}
			})
		}
	}
}

func TestRenderRejects(t *testing.T) {
	b := mustBackend(t, Options{Variant: Legacy})
	bad := []struct {
		name string
		rs   *rules.Ruleset
		want string
	}{
		{"invalid ruleset", &rules.Ruleset{Fix: "Bad_Fix", Family: rules.IPv4}, "kebab-case"},
		{"dnat port without protocol", &rules.Ruleset{Fix: "x", Family: rules.IPv4, Chains: []rules.Chain{{Name: "A", Type: rules.NAT, Rules: []rules.Rule{
			{Verdict: rules.Verdict{Kind: rules.DNAT, To: netip.MustParseAddrPort("10.0.0.1:80")}}}}}}, "needs Match.Protocol"},
		{"interface with space", &rules.Ruleset{Fix: "x", Family: rules.IPv4, Chains: []rules.Chain{{Name: "A", Type: rules.Filter, Rules: []rules.Rule{
			{Match: rules.Match{InInterfacePrefix: "eth 0"}}}}}}, "interface"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Render(tc.rs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestCommentRoundTrip(t *testing.T) {
	for _, c := range []string{"plain", `it's "quoted" \ and \"escaped\"`, "line\nbreak", strings.Repeat("é", 200)} {
		s := sanitizeComment(c)
		if len(s) > maxComment || strings.ContainsAny(s, "\n\r") {
			t.Errorf("sanitizeComment(%q) = %q", c, s)
		}
		args, err := splitArgs("-m comment --comment " + quote(s) + " -j ACCEPT")
		if err != nil {
			t.Fatal(err)
		}
		if len(args) != 6 || args[3] != s {
			t.Errorf("round trip of %q gave %q", s, args)
		}
	}
	if n, ok := counterOf("invalid-drop", "invalid-drop/dropped: drop it"); !ok || n != "dropped" {
		t.Errorf("counterOf = %q %v", n, ok)
	}
	if _, ok := counterOf("invalid-drop", "invalid-drop: not counted"); ok {
		t.Error("counterOf found a counter in a plain comment")
	}
}

func TestBucketNames(t *testing.T) {
	for _, tc := range []struct {
		chain string
		run   int
		p     string
		want  string
	}{
		{"EXTIP-DNAT", 1, "203.0.113.0/28", "NNM-EXTIP-DNAT-CB007100"},
		{"EXTIP-DNAT", 2, "203.0.113.0/28", "NNM-EXTIP-DNAT2-CB007100"},
		{"A-VERY-LONG-CHAIN-NAME-X", 1, "10.0.0.0/28", ""},
		{"EXTIP-DNAT", 1, "2001:db8:ff::/124", ""},
		{"A-VERY-LONG-CHAIN-NAME-X", 3, "2001:db8:ff::/124", ""},
	} {
		got := bucketName(tc.chain, tc.run, netip.MustParsePrefix(tc.p))
		if tc.want != "" && got != tc.want {
			t.Errorf("bucketName(%s, %d, %s) = %s, want %s", tc.chain, tc.run, tc.p, got, tc.want)
		}
		if len(got) > maxChainName || !strings.HasPrefix(got, ChainPrefix) {
			t.Errorf("bucketName(%s, %d, %s) = %s: not an NNM- name of at most %d characters", tc.chain, tc.run, tc.p, got, maxChainName)
		}
		if again := bucketName(tc.chain, tc.run, netip.MustParsePrefix(tc.p)); again != got {
			t.Errorf("bucketName is not stable: %s then %s", got, again)
		}
	}
	if a, b := bucketName("EXTIP-DNAT", 1, netip.MustParsePrefix("2001:db8::/124")), bucketName("EXTIP-DNAT", 1, netip.MustParsePrefix("2001:db8::10/124")); a == b {
		t.Errorf("two IPv6 buckets share the name %s", a)
	}
}

// TestUnorderedBuckets: the buckets of a run of one lookup rule are unordered (appended to in
// place), those of a longer run (a MARK rule per entry ahead of the DNAT rules) keep their order, and
// chains that are not buckets are never unordered.
func TestUnorderedBuckets(t *testing.T) {
	for _, f := range rules.Families {
		chains, _, err := renderChains(withSecondEntry(externalIPSharded(f)), scope{})
		if err != nil {
			t.Fatal(err)
		}
		runs := map[bool]int{}
		for _, c := range chains {
			first := c.parent != "" && !c.node && (strings.HasPrefix(c.name, "NNM-EXTIP-DNAT-") || strings.HasPrefix(c.name, "NNM-EXTIP-MASQ-"))
			if c.unordered != first {
				t.Errorf("%s: chain %s (parent %q) unordered = %v, want %v", f, c.name, c.parent, c.unordered, first)
			}
			if c.parent != "" && !c.node {
				runs[first]++
			}
		}
		if runs[true] == 0 || runs[false] == 0 {
			t.Errorf("%s: buckets of the first run %d, of the second %d: want both", f, runs[true], runs[false])
		}
		// One lookup rule that marks and DNATs renders a MARK line ahead of each DNAT line: ordered.
		rs := externalIP(f)
		rs.Chains[2].Rules[1].SetMark = 0x4000_0000
		chains, _, err = renderChains(rs, scope{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chains {
			if c.unordered {
				t.Errorf("%s: chain %s of a marking lookup rule is unordered", f, c.name)
			}
		}
	}
}

// TestBucketNamesOfTouchedBuckets: a change that keeps every bucket names only the buckets it
// renders, with the names the full naming gives them, and without the work of naming the others
// (at 10,000 entries the full naming was a third of the allocations of such a change).
func TestBucketNamesOfTouchedBuckets(t *testing.T) {
	for _, f := range []rules.Family{rules.IPv4, rules.IPv6} {
		t.Run(string(f), func(t *testing.T) {
			rs := externalIP(f)
			rs.Maps[0].Entries = scaleEntries(f, 10000)
			var c rules.Chain
			first := -1
			for _, ch := range rs.Chains {
				if i := slices.IndexFunc(ch.Rules, func(r rules.Rule) bool { return r.Match.Lookup != "" }); i >= 0 {
					c, first = ch, i
					break
				}
			}
			if first < 0 {
				t.Fatal("externalIP has no lookup rule")
			}
			tbl := tableOf(c.Type)
			all := bucketNames(rs, c, first, tbl, 1, kernelNames(rs), nil)
			if len(all) < 100 {
				t.Fatalf("%d buckets for 10,000 entries: the test needs many", len(all))
			}
			p := bucketPrefix(rs.Maps[0].Sorted()[5000].Addr)
			only := map[netip.Prefix]bool{p: true, netip.MustParsePrefix("192.0.2.0/28"): true} // one without entries
			got := bucketNames(rs, c, first, tbl, 1, kernelNames(rs), only)
			if len(got) != 1 || got[p] != all[p] {
				t.Errorf("bucketNames(only %v) named %d buckets, %v as %q; want that one only, as %q", p, len(got), p, got[p], all[p])
			}
			full := testing.AllocsPerRun(5, func() { bucketNames(rs, c, first, tbl, 1, kernelNames(rs), nil) })
			narrow := testing.AllocsPerRun(5, func() { bucketNames(rs, c, first, tbl, 1, kernelNames(rs), only) })
			if narrow > 20 || narrow*10 > full {
				t.Errorf("naming one touched bucket allocates %.0f times (all %d buckets: %.0f)", narrow, len(all), full)
			}
		})
	}
}
