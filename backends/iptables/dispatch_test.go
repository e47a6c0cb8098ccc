package iptables

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/netip"
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

// walk follows the dispatch rules of the rendered chains from chain for a packet to dst, as the
// kernel does: each rule is one step; a rule whose -d does not hold dst is passed, one that does
// is followed into its chain (a node, or a bucket: the end). It returns the bucket reached ("" for
// none), the dispatch rules met and the nodes entered in a row (the nesting).
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
		c := chains[target]
		if c == nil || c.parent == "" {
			continue // not a dispatch rule (the mark rules of the DNAT chain)
		}
		steps++
		if !d.Contains(dst) {
			continue
		}
		if !c.node {
			return target, steps, depth
		}
		got, n, dn := walk(chains, target, dst)
		steps += n
		depth = max(depth, dn+1)
		if got != "" {
			return got, steps, depth
		}
	}
	return "", steps, depth
}

// TestDispatchTree: with many buckets the dispatch is a tree: every entry's address reaches its own
// bucket, addresses of no bucket reach none, and the dispatch rules a packet meets grow with the
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
					if want := bucketName("EXTIP-DNAT", 1, bucketPrefix(a)); got != want {
						t.Fatalf("entry %d (%s) reaches %q, want its bucket %s", j, a, got, want)
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
						t.Fatalf("%s (no entry) reaches bucket %s", miss, got)
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
// and are listed there; every entry still reaches its bucket.
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
		if want := bucketName("EXTIP-DNAT", 1, bucketPrefix(e.Addr)); got != want {
			t.Errorf("%s reaches %q, want %s", e.Addr, got, want)
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
// the narrowed renderings applyEntries uses give, for every chain they hold in full (a bucket of the
// change, a chain with rules of its own, a dispatch node), exactly the rules the whole ruleset
// renders for that chain; with bucketsOnly (a change that keeps every bucket) they hold the changed
// buckets alone, and the whole ruleset has no new bucket. It fails when a scope names a bucket
// otherwise than the whole does, renders another bucket's entries into it, or takes a change that
// adds or drops a bucket for one that keeps them.
func TestScopeRendersWhatTheWholeRenders(t *testing.T) {
	for _, f := range rules.Families {
		rnd := rand.New(rand.NewPCG(7, uint64(len(f))))
		rs := externalIP(f)
		kept, notKept := 0, 0
		for range 300 {
			next := externalIP(f)
			next.Maps[0].Entries = mutateEntries(rnd, f, rs.Maps[0].Entries, 4, 0)
			touched := changedBuckets(rs, next)
			if touched == nil {
				rs = next
				continue
			}
			whole := func(r *rules.Ruleset) map[tchain]*rchain {
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
			before, after := whole(rs), whole(next)
			sc := scope{only: touched, bucketsOnly: bucketsKept(rs, next, touched)}
			if sc.bucketsOnly {
				kept++
				for k, c := range after {
					if before[k] == nil && c.parent != "" {
						t.Fatalf("%s: bucketsKept, but bucket %s is new", f, k)
					}
				}
			} else {
				notKept++
			}
			for _, r := range []*rules.Ruleset{rs, next} {
				all := whole(r)
				got, _, err := renderChains(r, sc)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range got {
					w := all[c.key()]
					if w == nil {
						t.Fatalf("%s: scope %+v rendered chain %s, which the whole ruleset has not", f, sc.bucketsOnly, c.name)
					}
					isBucket := w.parent != "" && !w.node
					if sc.bucketsOnly && (!isBucket || !touched[c.lookup][c.prefix]) {
						t.Fatalf("%s: bucketsOnly rendered %s, not a bucket of the change", f, c.name)
					}
					if isBucket && !touched[c.lookup][c.prefix] {
						if len(c.lines) != 0 {
							t.Fatalf("%s: untouched bucket %s rendered with %d rules", f, c.name, len(c.lines))
						}
						continue
					}
					if strings.Join(c.lines, "\n") != strings.Join(w.lines, "\n") {
						t.Fatalf("%s: chain %s: scope renders\n%s\nthe whole ruleset\n%s", f, c.name, strings.Join(c.lines, "\n"), strings.Join(w.lines, "\n"))
					}
				}
			}
			rs = next
		}
		if kept == 0 || notKept == 0 {
			t.Fatalf("%s: the changes took one way only (kept %d, not kept %d)", f, kept, notKept)
		}
		t.Logf("%s: %d changes kept every bucket, %d did not", f, kept, notKept)
	}
}
