package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// The lab's address plan, one per family (a fact in one place: the rulesets, the routes and the
// probes read it from here). Two identical paths share the server: the node holds the fix's rules,
// the floor node does not, and every measurement alternates between them connection by connection.
//
//	client ("pod")  c0 10.244.0.2/24     fd00:10:244::2/64    default via the node
//	node            n0 10.244.0.1/24     fd00:10:244::1/64    (pod side; the fix's pod CIDR)
//	                n1 192.168.99.1/24   fd00:99::1/64        default via the server
//	floor client    c0 10.245.0.2/24     fd00:10:245::2/64    default via the floor node
//	floor node      n0 10.245.0.1/24     fd00:10:245::1/64
//	                n1 192.168.98.1/24   fd00:98::1/64        default via the server
//	server          s0 192.168.99.2/24   fd00:99::2/64        routes back to each side's client; the
//	                s1 192.168.98.2/24   fd00:98::2/64        Service CIDR (10.96.0.0/16,
//	                                                          fd00:10:96::/112) and the floor's
//	                                                          (10.97.0.0/16, fd00:10:97::/112) are
//	                                                          local (AnyIP), a listener on port 80
//
// The External-IPs (the map's keys) are routed nowhere but by the node's default route: a packet to
// one is DNATed to its Cluster-IP, which the server answers.
type plan struct {
	family               rules.Family
	podCIDR, serviceCIDR netip.Prefix
	// floorExt and floorService are the floor node's one translation (floorRules): External-IP
	// traffic on the floor side goes to floorExtIP(i) for entry i and is mapped, by one rule, to
	// the same offset in floorService. So the floor's connections reach as many distinct server
	// addresses as the node's do (entry i's Cluster-IP on the node, its twin in floorService on the
	// floor), and Δ leaves out what reaching them costs: the lookup of the entry is what is left.
	floorExt, floorService netip.Prefix
	sides                  [2]side                // the node with the rules, the floor node
	consecutive, scattered func(i int) netip.Addr // the i-th External-IP of a layout (0-based)
}

// side is one client–node–server path's addresses.
type side struct {
	client, nodePod, nodeUp, server netip.Prefix
}

var plans = map[rules.Family]plan{
	rules.IPv4: {
		family: rules.IPv4, podCIDR: pfx("10.244.0.0/24"), serviceCIDR: pfx("10.96.0.0/16"),
		floorExt: pfx("198.18.0.0/16"), floorService: pfx("10.97.0.0/16"),
		sides: [2]side{
			{client: pfx("10.244.0.2/24"), nodePod: pfx("10.244.0.1/24"), nodeUp: pfx("192.168.99.1/24"), server: pfx("192.168.99.2/24")},
			{client: pfx("10.245.0.2/24"), nodePod: pfx("10.245.0.1/24"), nodeUp: pfx("192.168.98.1/24"), server: pfx("192.168.98.2/24")},
		},
		consecutive: func(i int) netip.Addr { return addN(netip.MustParseAddr("172.16.0.0"), uint64(i)+1) },
		scattered:   scattered4,
	},
	rules.IPv6: {
		family: rules.IPv6, podCIDR: pfx("fd00:10:244::/64"), serviceCIDR: pfx("fd00:10:96::/112"),
		floorExt: pfx("3fff::/112"), floorService: pfx("fd00:10:97::/112"),
		sides: [2]side{
			{client: pfx("fd00:10:244::2/64"), nodePod: pfx("fd00:10:244::1/64"), nodeUp: pfx("fd00:99::1/64"), server: pfx("fd00:99::2/64")},
			{client: pfx("fd00:10:245::2/64"), nodePod: pfx("fd00:10:245::1/64"), nodeUp: pfx("fd00:98::1/64"), server: pfx("fd00:98::2/64")},
		},
		consecutive: func(i int) netip.Addr { return addN(netip.MustParseAddr("2001:db8:ffff::"), uint64(i)+1) },
		scattered:   scattered6,
	},
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// clusterIP is the i-th Service's Cluster-IP: the Service CIDR's address i+1.
func (p plan) clusterIP(i int) netip.Addr { return addN(p.serviceCIDR.Addr(), uint64(i)+1) }

// floorExtIP is where the floor side sends entry i's External-IP traffic: floorExt's address i+1,
// which the floor node maps to floorService's address i+1.
func (p plan) floorExtIP(i int) netip.Addr { return addN(p.floorExt.Addr(), uint64(i)+1) }

// maxEntries is the largest map size the lab's address plan holds, in every family: entry i takes
// address i+1 of the Service CIDR and of the floor's two prefixes (clusterIP, floorExtIP), and
// must stay inside each.
func maxEntries() int {
	n := math.MaxInt
	for _, p := range plans {
		for _, pf := range []netip.Prefix{p.serviceCIDR, p.floorExt, p.floorService} {
			n = min(n, 1<<min(pf.Addr().BitLen()-pf.Bits(), 62)-1)
		}
	}
	return n
}

// addN is a + n (n well below the family's width).
func addN(a netip.Addr, n uint64) netip.Addr {
	b := a.As16()
	for i := 15; i >= 0 && n > 0; i-- {
		s := uint64(b[i]) + n&0xff
		b[i] = byte(s)
		n = n>>8 + s>>8
	}
	out := netip.AddrFrom16(b)
	if a.Is4() {
		out = out.Unmap()
	}
	return out
}

// spread24 is the i-th of 2^24 distinct 24-bit values, spread over the whole range (an odd
// multiplier is a bijection modulo 2^24).
func spread24(i int) uint32 { return uint32(uint64(i)*2654435761+0x9e3779) & 0xffffff }

// scattered4 is the i-th scattered IPv4 External-IP: .7 in its own /24, the /24s spread over the
// unicast space (first octet 11-223, without 127, 169.254/16, 172.16/12, 192.168/16 and 198.18/15:
// nothing the lab or the consecutive layout uses).
func scattered4(i int) netip.Addr {
	for j, n := 0, -1; ; j++ {
		v := spread24(j)
		a := netip.AddrFrom4([4]byte{byte(v >> 16), byte(v >> 8), byte(v), 7})
		o := a.As4()
		if o[0] < 11 || o[0] > 223 || o[0] == 127 || (o[0] == 169 && o[1] == 254) || (o[0] == 172 && o[1]&0xf0 == 16) ||
			(o[0] == 192 && o[1] == 168) || (o[0] == 198 && o[1]&0xfe == 18) {
			continue
		}
		if n++; n == i {
			return a
		}
	}
}

// scattered6 is the i-th scattered IPv6 External-IP: 2001:db8:XXXX:XX00::7, one /120 each (in fact
// one /56), spread over 24 bits of the prefix.
func scattered6(i int) netip.Addr {
	v := spread24(i)
	var b [16]byte
	copy(b[:], netip.MustParseAddr("2001:db8::").AsSlice())
	b[4], b[5], b[6] = byte(v>>16), byte(v>>8), byte(v)
	b[15] = 7
	return netip.AddrFrom16(b)
}

// lab is the five namespaces: per side a client and a node (0: with the rules, 1: the floor), and
// the server.
type lab struct {
	client, node [2]string
	server       string
}

func (l *lab) names() []string {
	return []string{l.client[0], l.node[0], l.client[1], l.node[1], l.server}
}

// newLab creates the namespaces, links, addresses and routes of both families, and on both nodes the
// stand-in for kube-proxy (see baseRules).
func newLab(ctx context.Context) (*lab, error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "nnm-dp-" + hex.EncodeToString(b)
	l := &lab{client: [2]string{id + "-c", id + "-fc"}, node: [2]string{id + "-n", id + "-fn"}, server: id + "-s"}
	if err := l.setup(ctx); err != nil {
		return nil, errors.Join(err, l.close())
	}
	return l, nil
}

func (l *lab) setup(ctx context.Context) error {
	for _, ns := range l.names() {
		if err := netns.Create(ctx, ns); err != nil {
			return err
		}
		if _, err := netns.Exec(ctx, ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"); err != nil {
			return err
		}
	}
	in := map[string][][]string{l.server: {
		{"sysctl", "-qw", "net.core.somaxconn=65535", "net.ipv4.tcp_max_syn_backlog=65535"},
		{"ip", "route", "add", "local", plans[rules.IPv4].serviceCIDR.String(), "dev", "lo"},
		{"ip", "-6", "route", "add", "local", plans[rules.IPv6].serviceCIDR.String(), "dev", "lo"},
		{"ip", "route", "add", "local", plans[rules.IPv4].floorService.String(), "dev", "lo"},
		{"ip", "-6", "route", "add", "local", plans[rules.IPv6].floorService.String(), "dev", "lo"},
	}}
	for i := range 2 {
		s0 := fmt.Sprintf("s%d", i)
		for _, c := range [][]string{
			{"ip", "link", "add", "c0", "netns", l.client[i], "type", "veth", "peer", "n0", "netns", l.node[i]},
			{"ip", "link", "add", "n1", "netns", l.node[i], "type", "veth", "peer", s0, "netns", l.server},
		} {
			if out, err := runHost(ctx, c...); err != nil {
				return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, out)
			}
		}
		in[l.client[i]] = [][]string{{"ip", "link", "set", "c0", "up"}}
		in[l.node[i]] = [][]string{
			{"sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
			{"ip", "link", "set", "n0", "up"},
			{"ip", "link", "set", "n1", "up"},
		}
		in[l.server] = append(in[l.server], []string{"ip", "link", "set", s0, "up"})
		for _, fam := range []rules.Family{rules.IPv4, rules.IPv6} {
			sd, ip := plans[fam].sides[i], "-4"
			addr := func(p netip.Prefix, dev string) []string {
				return []string{"ip", "addr", "add", p.String(), "dev", dev}
			}
			if fam == rules.IPv6 {
				ip = "-6"
				addr = func(p netip.Prefix, dev string) []string {
					return []string{"ip", "addr", "add", p.String(), "dev", dev, "nodad"}
				}
			}
			in[l.client[i]] = append(in[l.client[i]], addr(sd.client, "c0"),
				[]string{"ip", ip, "route", "add", "default", "via", sd.nodePod.Addr().String()})
			in[l.node[i]] = append(in[l.node[i]], addr(sd.nodePod, "n0"), addr(sd.nodeUp, "n1"),
				[]string{"ip", ip, "route", "add", "default", "via", sd.server.Addr().String()})
			in[l.server] = append(in[l.server], addr(sd.server, s0),
				[]string{"ip", ip, "route", "add", sd.client.Masked().String(), "via", sd.nodeUp.Addr().String()})
		}
	}
	for _, ns := range l.names() {
		for _, c := range in[ns] {
			if _, err := netns.Exec(ctx, ns, c...); err != nil {
				return err
			}
		}
	}
	for _, n := range l.node {
		if err := baseRules(ctx, n); err != nil {
			return err
		}
	}
	return floorRules(ctx, l.node[1])
}

// baseRules is what kube-proxy holds on every node and the floor has too: a nat table whose
// PREROUTING and OUTPUT jump to KUBE-SERVICES (empty here: IPVS answers the Service addresses) and
// whose POSTROUTING holds the masquerade rule, so conntrack and all three nat hooks run for every
// new connection with or without the agent (both families, iptables-nft). The fix's jumps go
// before KUBE-SERVICES, as on a real node. Without the PREROUTING and OUTPUT jumps iptables-nft
// would not create those base chains on the floor node, and the node with the rules would pay two
// nat hooks that the floor does not: Δ would not be the fix's rules alone.
func baseRules(ctx context.Context, node string) error {
	const base = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n" +
		"-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n" +
		"-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\nCOMMIT\n"
	return restoreBoth(ctx, node, func(rules.Family) string { return base })
}

// floorRules give the floor node the translation that External-IP traffic pays whatever looks its
// entry up: one rule, before KUBE-SERVICES in PREROUTING and OUTPUT, that maps floorExt onto
// floorService (NETMAP, a DNAT that keeps the address's offset), and one masquerade rule for what it
// DNATed, whose conntrack status test is the one the fix's guard makes. So an External-IP
// connection's Δ is what the lookup of its entry among the map's costs (the fix's dispatch, its
// buckets, its masquerade's), not the DNAT and the masquerade themselves, which any rule doing them
// pays (kube-proxy's for a Cluster-IP too), nor the thousands of distinct destinations that the
// connections reach on both sides. Each rule tests the destination first, with a native compare:
// a connection to a Cluster-IP (no entry) meets three such compares on the floor side, and nothing
// else of them. They carry no comment: under iptables-nft `-m comment` is an xt match, a cost the
// floor must not add.
func floorRules(ctx context.Context, node string) error {
	return restoreBoth(ctx, node, func(f rules.Family) string {
		p := plans[f]
		dnat := fmt.Sprintf("-d %s -p tcp -m tcp --dport 80 -j NETMAP --to %s", p.floorExt, p.floorService)
		return "*nat\n-I PREROUTING 1 " + dnat + "\n-I OUTPUT 1 " + dnat + "\n" +
			fmt.Sprintf("-I POSTROUTING 1 -d %s -m conntrack --ctstate DNAT -j MASQUERADE\n", p.floorService) + "COMMIT\n"
	})
}

// restoreBoth loads text(family) into node with iptables-nft-restore --noflush, both families.
func restoreBoth(ctx context.Context, node string, text func(rules.Family) string) error {
	// In order: nft lists tables as they were made, and the two nodes' dumps are compared.
	for _, t := range []struct {
		f    rules.Family
		tool string
	}{{rules.IPv4, "iptables-nft-restore"}, {rules.IPv6, "ip6tables-nft-restore"}} {
		f, tool := t.f, t.tool
		cmd := netns.Command(ctx, node, tool, "--noflush")
		cmd.Stdin = strings.NewReader(text(f))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s in %s: %w: %s", tool, node, err, out)
		}
	}
	return nil
}

// flushConntrack empties both nodes' conntrack tables, so every probe connection is a new entry.
func (l *lab) flushConntrack(ctx context.Context) error {
	for _, n := range l.node {
		for _, f := range []string{"ipv4", "ipv6"} {
			out, err := netns.Exec(ctx, n, "conntrack", "-F", "-f", f)
			if err != nil && !strings.Contains(out, "flushed") {
				return err
			}
		}
	}
	return nil
}

func (l *lab) close() error {
	var errs []error
	for _, ns := range l.names() {
		errs = append(errs, netns.Delete(context.Background(), ns))
	}
	return errors.Join(errs...)
}
