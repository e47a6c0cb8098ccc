package iptables

import (
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/connlabel"
)

// scatteredDNAT is externalIP(family) with n entries (TCP port 80), each External-IP in its own
// bucket, the buckets spread over the address space (IPv4: 11.0.0.0-222.255.255.0; IPv6: 2001:db8::/32
// with 24 varying bits above the /120).
func scatteredDNAT(family rules.Family, n int) *rules.Ruleset {
	rs := externalIP(family)
	rs.Maps[0].Entries = nil
	for i := range n {
		rs.Maps[0].Entries = append(rs.Maps[0].Entries, rules.MapEntry{Addr: scatteredAddr(family, i), Protocol: rules.TCP, Port: 80,
			To: netip.AddrPortFrom(byFamily(family, netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")), 8080), Comment: fmt.Sprintf("ns/svc-%d:http", i)})
	}
	return rs
}

func scatteredAddr(family rules.Family, i int) netip.Addr {
	v := uint32(uint64(i)*2654435761) & 0xffffff
	if family == rules.IPv4 {
		return netip.AddrFrom4([4]byte{11 + byte(v>>16)%212, byte(v >> 8), byte(v), 7})
	}
	b := netip.MustParseAddr("2001:db8::7").As16()
	b[4], b[5], b[6] = byte(v>>16), byte(v>>8), byte(v)
	return netip.AddrFrom16(b)
}

// walk follows the rendered chains from chain for a packet to dst, as the kernel does: a rule whose
// -d does not hold dst is passed (a rule without -d, the DNAT chain's mark rules, too); a dispatch
// rule that holds it is followed into its chain (a node or a bucket); any other rule that holds it is
// the end: an entry's rule, in its bucket or inlined. It returns that rule ("" for none), the rules
// with a -d met, and the nodes entered in a row (the nesting).
func walk(chains map[string]*rchain, from string, dst netip.Addr) (string, int, int) {
	steps, depth := 0, 0
	for _, l := range chains[from].lines {
		f := strings.Fields(l)
		var d netip.Prefix
		target := ""
		for i := 0; i+1 < len(f); i++ {
			switch f[i] {
			case "-d":
				d = netip.MustParsePrefix(f[i+1])
			case "-j", "-g":
				target = f[i+1]
			}
		}
		if !d.IsValid() {
			continue
		}
		steps++
		if !d.Contains(dst) {
			continue
		}
		c := chains[target]
		if c == nil || c.parent == "" {
			return l, steps, depth // an entry's rule
		}
		got, n, dn := walk(chains, target, dst)
		steps += n
		if c.node {
			depth = max(depth, dn+1)
		}
		if got != "" {
			return got, steps, depth
		}
	}
	return "", steps, depth
}

// entryRule says whether rule l is the DNAT rule of an entry at address a.
func entryRule(l string, a netip.Addr) bool {
	return strings.Contains(l, " -d "+netip.PrefixFrom(a, a.BitLen()).String()+" ") && strings.Contains(l, " -j DNAT ")
}

// TestDispatchTree: with many buckets the dispatch is a tree: every entry's address reaches its own
// rule (its bucket's, inlined: one entry a bucket), addresses of no bucket reach none, and the dispatch rules a packet meets grow with the
// logarithm of the buckets (today's one rule per bucket met all 20,000); up to dispatchLeaf buckets
// it stays one rule per bucket in the chain.
func TestDispatchTree(t *testing.T) {
	for _, family := range []rules.Family{rules.IPv4, rules.IPv6} {
		for _, n := range []int{dispatchLeaf, 17, 100, 2000, 20000} {
			t.Run(fmt.Sprintf("%s/%d", family, n), func(t *testing.T) {
				rs := scatteredDNAT(family, n)
				out, _, err := renderChains(rs, scope{})
				if err != nil {
					t.Fatal(err)
				}
				chains := map[string]*rchain{}
				nodes := 0
				for _, c := range out {
					chains[c.name] = c
					if c.node {
						nodes++
					}
					if len(c.name) > maxChainName {
						t.Errorf("chain name %s is longer than %d", c.name, maxChainName)
					}
				}
				if n <= dispatchLeaf && nodes != 0 {
					t.Errorf("%d buckets made %d dispatch nodes, want none", n, nodes)
				}
				// Levels of dispatchStride bits, up to 16 rules each (a random trie is a little deeper
				// than log16(n/dispatchLeaf)), and dispatchLeaf at the bottom.
				levels := (bits.Len(uint(n)) + dispatchStride - 1) / dispatchStride
				bound := 16*levels + dispatchLeaf
				worst, deepest := 0, 0
				rng := rand.New(rand.NewPCG(1, 2))
				for range min(n, 2000) {
					j := rng.IntN(n)
					a := scatteredAddr(family, j)
					got, steps, depth := walk(chains, "NNM-EXTIP-DNAT", a)
					deepest = max(deepest, depth)
					if !entryRule(got, a) {
						t.Fatalf("entry %d (%s) reaches %q, want its DNAT rule", j, a, got)
					}
					worst = max(worst, steps)
					// An address beside it, outside every bucket (the next /24 or /120 up; scattered
					// entries never share one).
					miss := a.Next()
					for bucketPrefix(miss) == bucketPrefix(a) {
						miss = miss.Next()
					}
					if _, used := chains[bucketName("EXTIP-DNAT", 1, bucketPrefix(miss))]; used {
						continue
					}
					if got, steps, _ := walk(chains, "NNM-EXTIP-DNAT", miss); got != "" {
						t.Fatalf("%s (no entry) reaches rule %s", miss, got)
					} else {
						worst = max(worst, steps)
					}
				}
				if worst > bound {
					t.Errorf("%d buckets: a packet meets up to %d dispatch rules, want at most %d", n, worst, bound)
				}
				if deepest > levels {
					t.Errorf("%d buckets: nodes nest %d deep, want at most %d", n, deepest, levels)
				}
				t.Logf("%d buckets: %d dispatch nodes, at most %d dispatch rules met (bound %d), nodes nest %d deep", n, nodes, worst, bound, deepest)
			})
		}
	}
}

// nestedDNAT is an IPv6 DNAT ruleset of 30 buckets chosen to nest: bucket k has only bit 4k set,
// so every level of the tree splits one bucket off the rest (what whoever writes ingress IPs could
// choose). Without a limit the nodes would nest 14 deep, and nf_tables refuses jumps nested 16 deep.
func nestedDNAT() *rules.Ruleset {
	rs := scatteredDNAT(rules.IPv6, 0)
	for k := range 30 {
		var b [16]byte
		b[k/2] = 0x80 >> (4 * (k % 2))
		b[15] = 7
		rs.Maps[0].Entries = append(rs.Maps[0].Entries, rules.MapEntry{Addr: netip.AddrFrom16(b), Protocol: rules.TCP, Port: 80,
			To: netip.AddrPortFrom(netip.MustParseAddr("fd00:96::10"), 8080), Comment: fmt.Sprintf("ns/nest-%d:http", k)})
	}
	return rs
}

// TestDispatchTreeDepth: prefixes that nest a node per level stop nesting at dispatchDepth nodes
// and are listed there; every entry still reaches its rule.
func TestDispatchTreeDepth(t *testing.T) {
	rs := nestedDNAT()
	out, _, err := renderChains(rs, scope{})
	if err != nil {
		t.Fatal(err)
	}
	chains := map[string]*rchain{}
	for _, c := range out {
		chains[c.name] = c
	}
	deepest := 0
	for _, e := range rs.Maps[0].Entries {
		got, _, depth := walk(chains, "NNM-EXTIP-DNAT", e.Addr)
		if !entryRule(got, e.Addr) {
			t.Errorf("%s reaches %q, want its DNAT rule", e.Addr, got)
		}
		deepest = max(deepest, depth)
	}
	if deepest != dispatchDepth {
		t.Errorf("nodes nest %d deep, want the limit %d", deepest, dispatchDepth)
	}
}

// TestDispatchTreeGolden pins the tree's rendering for 40 scattered buckets, both families.
func TestDispatchTreeGolden(t *testing.T) {
	for _, family := range []rules.Family{rules.IPv4, rules.IPv6} {
		b := mustBackend(t, Options{Variant: NFT})
		got, err := b.Render(scatteredDNAT(family, 40))
		if err != nil {
			t.Fatal(err)
		}
		golden(t, "externalip-tree-"+string(family), got)
	}
}

// scatteredMasq is scatteredDNAT with the DNAT fix's masquerade (issue #41): the postrouting chain
// looks the map up by the connection's original destination, for connections with the DNAT status.
func scatteredMasq(family rules.Family, n int) *rules.Ruleset {
	rs := scatteredDNAT(family, n)
	rs.Chains[3].Rules = []rules.Rule{{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: "external-ips", LookupKey: rules.LookupCTOriginal},
		Verdict: rules.Verdict{Kind: rules.Masquerade}, Comment: "masquerade what was DNATed"}}
	return rs
}

// TestMasqueradeByLabel: the masquerade's lookup by original destination is one rule whatever the
// map's size, a match of the map's conntrack label (connlabel.go) ahead of the rule's conntrack
// status, and no bucket or node of its own; every rule that DNATs an entry sets
// that label after its native matches; a ruleset with no such lookup sets none.
func TestMasqueradeByLabel(t *testing.T) {
	for _, family := range []rules.Family{rules.IPv4, rules.IPv6} {
		for _, n := range []int{1, 100, 20000} {
			t.Run(fmt.Sprintf("%s/%d", family, n), func(t *testing.T) {
				rs := scatteredMasq(family, n)
				label, err := connlabel.Bit(rs.Fix, "external-ips")
				if err != nil {
					t.Fatal(err)
				}
				out, _, err := renderChains(rs, scope{})
				if err != nil {
					t.Fatal(err)
				}
				want := fmt.Sprintf(`-A NNM-EXTIP-MASQ -m connlabel --label %d -m conntrack --ctstate DNAT -m comment --comment "ipvs-externalip-dnat: masquerade what was DNATed" -j MASQUERADE`, label)
				set := fmt.Sprintf(" --dport 80 -m connlabel --label %d --set ", label)
				dnats := 0
				for _, c := range out {
					switch {
					case c.name == "NNM-EXTIP-MASQ":
						if len(c.lines) != 1 || c.lines[0] != want {
							t.Fatalf("the postrouting chain is\n%s\nwant\n%s", strings.Join(c.lines, "\n"), want)
						}
					case strings.HasPrefix(c.name, "NNM-EXTIP-MASQ"):
						t.Fatalf("the masquerade has a chain of its own: %s", c.name)
					}
					for _, l := range c.lines {
						if strings.Contains(l, " -j DNAT ") {
							dnats++
							if !strings.Contains(l, set) {
								t.Fatalf("a DNAT rule does not set label %d after its port: %s", label, l)
							}
						}
					}
				}
				if dnats != n {
					t.Errorf("%d DNAT rules for %d entries", dnats, n)
				}
				plain, _, err := renderChains(scatteredDNAT(family, n), scope{})
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range plain {
					for _, l := range c.lines {
						if strings.Contains(l, "connlabel") {
							t.Fatalf("no lookup by original destination, but a label: %s", l)
						}
					}
				}
			})
		}
	}
}

// TestScopeRendersWhatTheWholeRenders: for random changes of a map (mutateEntries) on both families,
// with the record of the whole rendering before, the narrowed renderings of renderChange give, for
// every chain they hold in full (a bucket of the change, a chain with rules of its own, a dispatch
// node), exactly the rules the whole ruleset renders for that chain; with kept (a change that keeps
// every bucket, none of them inlined) they hold the changed buckets alone, and the whole ruleset has
// no new bucket; otherwise they hold every chain of the whole, and the inlined buckets' rules in
// theirs. With the record true, no change is declined (applyEntries would take the full way: by
// renderChange, or for an untouched bucket rendered as a chain that the record has not).
// It fails when a scope names a bucket otherwise than the whole does, renders another bucket's
// entries into it, inlines otherwise than the whole, or takes a change that adds or drops a bucket
// for one that keeps them.
func TestScopeRendersWhatTheWholeRenders(t *testing.T) {
	for _, f := range rules.Families {
		rnd := rand.New(rand.NewPCG(7, uint64(len(f))))
		rs := externalIP(f)
		counts := map[string]int{}
		for range 300 {
			next := externalIP(f)
			next.Maps[0].Entries = mutateEntries(rnd, f, rs.Maps[0].Entries, 4, 0)
			touched := changedBuckets(rs, next)
			if touched == nil {
				rs = next
				continue
			}
			before, after := wholeChains(t, rs), wholeChains(t, next)
			counts[scopeCase(t, f, touched, before, after, rs, next)]++
			for _, c := range after {
				if len(c.holds) > 0 {
					counts["with an inlined bucket"]++
					break
				}
			}
			rs = next
		}
		if counts["kept"] == 0 || counts["not kept"] == 0 || counts["with an inlined bucket"] == 0 || counts["declined"] != 0 {
			t.Fatalf("%s: the changes did not take both ways, or were declined: %v", f, counts)
		}
		t.Logf("%s: %v", f, counts)
	}
}

// wholeChains is the whole rendering of r, by chain.
func wholeChains(t *testing.T, r *rules.Ruleset) map[tchain]*rchain {
	t.Helper()
	cs, _, err := renderChains(r, scope{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[tchain]*rchain{}
	for _, c := range cs {
		m[c.key()] = c
	}
	return m
}

// scopeCase checks renderChange's renderings of the change from rs to next against the wholes
// before and after, and says which way the change took: "kept", "not kept" or "declined".
func scopeCase(t *testing.T, f rules.Family, touched map[string]map[netip.Prefix]bool, before, after map[tchain]*rchain, rs, next *rules.Ruleset) string {
	t.Helper()
	prev := newRendering(slices.Collect(maps.Values(before)), nil, nil).record(nil)
	old, now, kept, ok := renderChange(rs, next, touched, prev)
	if !ok {
		return "declined"
	}
	same := func(c, w *rchain, what string) {
		if w == nil {
			t.Fatalf("%s: %s: rendered chain %s, which the whole ruleset has not", f, what, c.name)
		}
		if strings.Join(c.lines, "\n") != strings.Join(w.lines, "\n") {
			t.Fatalf("%s: %s: chain %s: scope renders\n%s\nthe whole ruleset\n%s", f, what, c.name, strings.Join(c.lines, "\n"), strings.Join(w.lines, "\n"))
		}
	}
	untouched := func(c *rchain) bool { return !c.node && c.lookup != "" && !touched[c.lookup][c.prefix] }
	for _, c := range now {
		if untouched(c) && !prev.chains[c.key()] {
			return "declined" // applyEntries: an untouched bucket cannot appear
		}
	}
	for _, c := range old {
		same(c, before[c.key()], "before")
	}
	for _, c := range now {
		isBucket := !c.node && c.lookup != ""
		if untouched(c) { // rendered empty, or in full (scope.linesOf)
			if w := after[c.key()]; w == nil || (len(c.lines) != 0 && strings.Join(c.lines, "\n") != strings.Join(w.lines, "\n")) {
				t.Fatalf("%s: untouched bucket %s rendered with %d rules, or gone from the whole", f, c.name, len(c.lines))
			}
			continue
		}
		if kept && !isBucket {
			t.Fatalf("%s: kept, but rendered %s, not a bucket of the change", f, c.name)
		}
		same(c, after[c.key()], "after")
	}
	if kept {
		for k, c := range after {
			if before[k] == nil && c.parent != "" {
				t.Fatalf("%s: kept, but bucket %s is new", f, k)
			}
		}
		return "kept"
	}
	rendered := map[tchain]bool{}
	for _, c := range now {
		rendered[c.key()] = true
	}
	for k := range after {
		if !rendered[k] {
			t.Fatalf("%s: not kept, but chain %s of the whole is not rendered", f, k)
		}
	}
	return "not kept"
}
