package main

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestLabSmoke runs the benchmark's matrix at toy size (100 connections, 300 entries, both backends
// and families, both layouts and paths): the lab routes, the fix's rules load through each backend
// and DNAT the External-IP traffic to the server, and the rules are gone for the floor. It checks
// that the benchmark works; it asserts no timing.
func TestLabSmoke(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-restore", "ip6tables-nft-restore", "nft", "conntrack", "ip")
	ctx := context.Background()
	o := options{n: 100, sizes: []int{0, 300}, backends: []string{"iptables", "nftables"}, paths: []string{"pod", "host"},
		families: []rules.Family{rules.IPv4, rules.IPv6}, layouts: []layout{consecutive, scattered}, runs: 1}
	var progress strings.Builder
	cells, err := measure(ctx, o, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	// backends × families × (size 0: 2 paths × miss; 2 layouts × 2 paths × (miss, hit))
	if want := 2 * 2 * (2 + 2*2*2); len(cells) != want {
		t.Fatalf("%d cells, want %d", len(cells), want)
	}
	for _, c := range cells {
		if len(c.rules.lat) != o.n || len(c.floor.lat) != o.n {
			t.Errorf("%+v: %d and %d connections measured, want %d", c, len(c.rules.lat), len(c.floor.lat), o.n)
		}
	}
	text := report(describeMachine(), o, cells)
	if !strings.Contains(text, "| 1 | iptables | ipv6 | scattered | 300 | host (OUTPUT) |") {
		t.Errorf("report lacks a row:\n%s", text)
	}
	if svg := plot(cells); !strings.Contains(svg, "<polyline") || !strings.HasSuffix(svg, "</svg>\n") {
		t.Errorf("plot:\n%s", svg)
	}
}

// TestLoadIsTheFixsRules: a load leaves the fix's DNAT of every entry in the node (iptables rule
// or nftables map element), and loading nil removes it.
func TestLoadIsTheFixsRules(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-restore", "ip6tables-nft-restore", "nft", "ip")
	ctx := context.Background()
	l, err := newLab(ctx)
	if err != nil {
		netns.Unavailable(t, "lab: %v", err)
	}
	defer l.close()
	for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
		p := plans[fam]
		rs, err := ruleset(p, scattered, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, be := range []string{"iptables", "nftables"} {
			if err := l.load(ctx, be, fam, rs); err != nil {
				t.Fatal(err)
			}
			got, err := l.kernelRules(ctx, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{0, 49} {
				ext, cip := p.extIP(scattered, i).String(), p.clusterIP(i).String()
				if !strings.Contains(got, ext) || !strings.Contains(got, cip) {
					t.Errorf("%s %s: entry %d (%s → %s) not in the kernel:\n%s", be, fam, i, ext, cip, got)
				}
			}
			if err := l.load(ctx, be, fam, nil); err != nil {
				t.Fatal(err)
			}
			got, err = l.kernelRules(ctx, fam)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(got, "NNM-") || strings.Contains(got, "nnm-") {
				t.Errorf("%s %s: the fix's rules are still there after removal:\n%s", be, fam, got)
			}
		}
	}
}

// TestFloorIsTheNodeWithoutTheRules: the floor node holds what the node holds without the fix's
// rules (the same nat base chains and kube-proxy stand-in, so the same hooks run for every new
// connection) and its one-rule translation of External-IP traffic (floorRules), and with the rules
// loaded the node differs from it only by the fix's chains, tables and jumps.
func TestFloorIsTheNodeWithoutTheRules(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-restore", "ip6tables-nft-restore", "nft", "ip")
	ctx := context.Background()
	l, err := newLab(ctx)
	if err != nil {
		netns.Unavailable(t, "lab: %v", err)
	}
	defer l.close()
	dump := func(ns string) string {
		out, err := netns.Exec(ctx, ns, "nft", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		return withoutTheFix(out)
	}
	floor := dump(l.node[1])
	translation := floorTranslation(floor)
	if len(translation) != 6 { // 3 rules, ip and ip6
		t.Errorf("the floor node holds %d rules of its one-rule translation, want 6:\n%s", len(translation), floor)
	}
	floor = strings.Join(slices.DeleteFunc(strings.Split(floor, "\n"), func(l string) bool { return slices.Contains(translation, l) }), "\n")
	for _, hook := range []string{"type nat hook prerouting", "type nat hook output", "type nat hook postrouting"} {
		if strings.Count(floor, hook) != 2 { // ip and ip6
			t.Errorf("the floor node lacks a %s chain in a family:\n%s", hook, floor)
		}
	}
	if got := dump(l.node[0]); got != floor {
		t.Errorf("before any load the nodes differ:\n%s\nfloor:\n%s", got, floor)
	}
	for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
		rs, err := ruleset(plans[fam], scattered, 20)
		if err != nil {
			t.Fatal(err)
		}
		for _, be := range []string{"iptables", "nftables"} {
			if err := l.load(ctx, be, fam, rs); err != nil {
				t.Fatal(err)
			}
			if got := dump(l.node[0]); got != floor {
				t.Errorf("%s %s: the node holds more than the floor and the fix's rules:\n%s\nfloor:\n%s", be, fam, got, floor)
			}
			if err := l.load(ctx, be, fam, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// withoutTheFix is an nft list ruleset without the fix's own objects (its tables, its chains, the
// jumps to them) and without counter values.
func withoutTheFix(dump string) string {
	var out []string
	skip := ""
	for _, line := range strings.Split(dump, "\n") {
		trim := strings.TrimSpace(line)
		if skip != "" {
			if line == skip {
				skip = ""
			}
			continue
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, "\t"))]
		if (strings.HasPrefix(trim, "table ") && strings.Contains(trim, " nnm")) || strings.HasPrefix(trim, "chain NNM-") {
			skip = indent + "}"
			continue
		}
		if strings.Contains(trim, "jump NNM-") || strings.HasPrefix(trim, "# Warning") || trim == "" {
			continue
		}
		out = append(out, counterValues.ReplaceAllString(line, "counter"))
	}
	return strings.Join(out, "\n")
}

// floorTranslation is the lines of an nft dump that match a floor address (floorRules), as nft
// lists them ("daddr A ").
func floorTranslation(dump string) []string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		for _, p := range plans {
			if strings.Contains(l, "daddr "+p.floorExt.String()+" ") || strings.Contains(l, "daddr "+p.floorService.String()+" ") {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

var counterValues = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// TestSizes: a size the address plan cannot hold (an entry's Cluster-IP or floor twin outside its
// prefix) is refused by name, and the default sizes are held.
func TestSizes(t *testing.T) {
	if got := maxEntries(); got != 65535 {
		t.Errorf("maxEntries = %d, want 65535 (the /16 and /112 prefixes)", got)
	}
	if _, err := ints("0,1000,10000,50000"); err != nil {
		t.Errorf("default sizes: %v", err)
	}
	for _, bad := range []string{"65536", "-1", "1000,100000"} {
		if _, err := ints(bad); err == nil || !strings.Contains(err.Error(), "size ") {
			t.Errorf("sizes %q: err %v, want a size refused", bad, err)
		}
	}
	for _, p := range plans {
		last := maxEntries() - 1
		for _, a := range []struct {
			pf netip.Prefix
			ip netip.Addr
		}{{p.serviceCIDR, p.clusterIP(last)}, {p.floorExt, p.floorExtIP(last)}} {
			if !a.pf.Contains(a.ip) {
				t.Errorf("%s: entry %d's address %s is outside %s", p.family, last, a.ip, a.pf)
			}
		}
	}
}

// TestTargets: -hot narrows External-IP traffic to the first entries and leaves the rest alone.
func TestTargets(t *testing.T) {
	maxOf := func(idx []int) int { return slices.Max(idx) }
	if m := maxOf(targets(50000, 100, "hit", 10000)); m >= 100 {
		t.Errorf("hot 100: an External-IP connection went to entry %d", m)
	}
	if m := maxOf(targets(50000, 100, "miss", 10000)); m < 100 {
		t.Errorf("hot 100 narrowed no-entry traffic too: highest entry %d", m)
	}
	if m := maxOf(targets(50000, 0, "hit", 10000)); m < 40000 {
		t.Errorf("without hot, External-IP traffic reached only the first %d of 50,000 entries", m+1)
	}
	if m := maxOf(targets(1000, 5000, "hit", 10000)); m >= 1000 {
		t.Errorf("hot above the entries: entry %d of 1,000", m)
	}
}
