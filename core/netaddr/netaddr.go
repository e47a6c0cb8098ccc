// Package netaddr knows which IP addresses have a meaning of their own that a node must never hand to
// a Service: the IANA special-purpose address registries (IPv4 and IPv6) plus multicast, limited
// broadcast and the deprecated IPv6 forms. A fix that rewrites destinations (DNAT) asks NeverDNAT
// before it takes an address over, so that a Service status nobody vetted cannot redirect the node's
// traffic to loopback, to the cloud metadata address or to its own networks.
//
// The decision follows the registries' own columns: a block whose addresses are not valid
// destinations ("Destination: False") or that routers must not forward ("Forwardable: False") is
// refused; the most specific block containing an address decides (192.0.0.0/24 is refused as a whole,
// but its PCP and TURN anycast addresses are ordinary forwardable destinations). Private-use
// (RFC 1918, ULA), shared (100.64.0.0/10, CGNAT, used by MetalLB pools) and benchmarking ranges are
// forwardable and stay allowed: they are what LoadBalancer pools are made of. The documentation
// ranges (TEST-NET-1/2/3, 2001:db8::/32, 3fff::/20) are "Forwardable: False" in the registry but are
// allowed on purpose: they have no meaning on a node, so taking them over cannot redirect anything
// that was going somewhere else, and they are what examples, tests and lab clusters use. A cluster
// that wants them refused narrows its allowed ranges instead.
//
// Registries (checked 2026-11): https://www.iana.org/assignments/iana-ipv4-special-registry and
// https://www.iana.org/assignments/iana-ipv6-special-registry; multicast and 240.0.0.0/4 come from the
// address-space registries, the IPv4-compatible form from RFC 4291 section 2.5.5.1, the deprecated
// site-local fec0::/10 from RFC 3879 (still routed inside some sites, never a Service address).
//
// Two more rules close what the registries leave open (issue #19): the cloud metadata endpoints
// outside the refused blocks (Metadata: Alibaba 100.100.100.200 in shared space, Azure 168.63.129.16
// in public space, AWS fd00:ec2::254 in unique-local space), and the IPv6 forms that carry an IPv4
// address a translator or tunnel relay delivers to (NAT64, 6to4, Teredo: Embedded), which are
// judged by the IPv4 address they carry, so 64:ff9b::a9fe:a9fe is refused as 169.254.169.254 is.
package netaddr

import (
	"fmt"
	"net/netip"
	"slices"
)

// Block is one entry of the table.
type Block struct {
	Prefix netip.Prefix
	// Name is the registry's name of the block, used in skip details and logs.
	Name string
	// Refused says the block's addresses must never be DNATed.
	Refused bool
	// Ref is the RFC or registry that defines the block.
	Ref string
}

func block(prefix, name string, refused bool, ref string) Block {
	return Block{Prefix: netip.MustParsePrefix(prefix), Name: name, Refused: refused, Ref: ref}
}

// endpoint is an entry of Metadata: a single address, always refused.
func endpoint(addr, name, ref string) Block {
	a := netip.MustParseAddr(addr)
	return Block{Prefix: netip.PrefixFrom(a, a.BitLen()), Name: name, Refused: true, Ref: ref}
}

const (
	refuse = true
	allow  = false
)

// Blocks is the table, in registry order. Entries marked allow are listed where a more specific
// block lifts a refusal (192.0.0.0/24, 2001::/23) or where the choice is worth stating.
var Blocks = []Block{
	// IPv4 special-purpose registry.
	block("0.0.0.0/8", "this network", refuse, "RFC 791"),
	block("0.0.0.0/32", "this host on this network (unspecified)", refuse, "RFC 1122"),
	block("10.0.0.0/8", "private-use", allow, "RFC 1918"),
	block("100.64.0.0/10", "shared address space", allow, "RFC 6598"),
	block("127.0.0.0/8", "loopback", refuse, "RFC 1122"),
	block("169.254.0.0/16", "link-local", refuse, "RFC 3927"),
	block("172.16.0.0/12", "private-use", allow, "RFC 1918"),
	block("192.0.0.0/24", "IETF protocol assignments", refuse, "RFC 6890"),
	block("192.0.0.0/29", "IPv4 service continuity prefix", allow, "RFC 7335"),
	block("192.0.0.8/32", "IPv4 dummy address", refuse, "RFC 7600"),
	block("192.0.0.9/32", "port control protocol anycast", allow, "RFC 7723"),
	block("192.0.0.10/32", "traversal using relays around NAT anycast", allow, "RFC 8155"),
	block("192.0.0.170/31", "NAT64/DNS64 discovery", refuse, "RFC 8880"),
	block("192.0.2.0/24", "documentation (TEST-NET-1)", allow, "RFC 5737"),
	block("192.31.196.0/24", "AS112-v4", allow, "RFC 7535"),
	block("192.52.193.0/24", "automatic multicast tunneling", allow, "RFC 7450"),
	block("192.88.99.0/24", "deprecated 6to4 relay anycast", allow, "RFC 7526"),
	block("192.168.0.0/16", "private-use", allow, "RFC 1918"),
	block("192.175.48.0/24", "direct delegation AS112 service", allow, "RFC 7534"),
	block("198.18.0.0/15", "benchmarking", allow, "RFC 2544"),
	block("198.51.100.0/24", "documentation (TEST-NET-2)", allow, "RFC 5737"),
	block("203.0.113.0/24", "documentation (TEST-NET-3)", allow, "RFC 5737"),
	block("240.0.0.0/4", "reserved", refuse, "RFC 1112"),
	block("255.255.255.255/32", "limited broadcast", refuse, "RFC 919"),
	// IPv4 address space registry.
	block("224.0.0.0/4", "multicast", refuse, "RFC 5771"),

	// IPv6 special-purpose registry.
	block("::1/128", "loopback", refuse, "RFC 4291"),
	block("::/128", "unspecified", refuse, "RFC 4291"),
	block("::ffff:0:0/96", "IPv4-mapped", refuse, "RFC 4291"),
	block("64:ff9b::/96", "IPv4-IPv6 translation", allow, "RFC 6052"),
	block("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", allow, "RFC 8215"),
	block("100::/64", "discard-only", allow, "RFC 6666"),
	block("100:0:0:1::/64", "dummy IPv6 prefix", refuse, "RFC 9780"),
	block("2001::/23", "IETF protocol assignments", refuse, "RFC 2928"),
	block("2001::/32", "TEREDO", allow, "RFC 4380"),
	block("2001:1::1/128", "port control protocol anycast", allow, "RFC 7723"),
	block("2001:1::2/128", "traversal using relays around NAT anycast", allow, "RFC 8155"),
	block("2001:1::3/128", "DNS-SD service registration protocol anycast", allow, "RFC 9665"),
	block("2001:2::/48", "benchmarking", allow, "RFC 5180"),
	block("2001:3::/32", "automatic multicast tunneling", allow, "RFC 7450"),
	block("2001:4:112::/48", "AS112-v6", allow, "RFC 7535"),
	block("2001:10::/28", "deprecated ORCHID", refuse, "RFC 4843"),
	block("2001:20::/28", "ORCHIDv2", allow, "RFC 7343"),
	block("2001:30::/28", "drone remote ID protocol entity tags", allow, "RFC 9374"),
	block("2001:db8::/32", "documentation", allow, "RFC 3849"),
	block("2002::/16", "6to4", allow, "RFC 3056"),
	block("2620:4f:8000::/48", "direct delegation AS112 service", allow, "RFC 7534"),
	block("3fff::/20", "documentation", allow, "RFC 9637"),
	block("5f00::/16", "segment routing (SRv6) SIDs", allow, "RFC 9602"),
	block("fc00::/7", "unique-local", allow, "RFC 4193"),
	block("fe80::/10", "link-local unicast", refuse, "RFC 4291"),
	block("fec0::/10", "deprecated site-local unicast", refuse, "RFC 3879"),
	// IPv6 addressing architecture.
	block("::/96", "deprecated IPv4-compatible", refuse, "RFC 4291"),
	block("ff00::/8", "multicast", refuse, "RFC 4291"),
}

// Lookup returns the most specific block of the table that contains a, and false when a is in none
// (ordinary unicast space). An IPv4-mapped address is looked up as such (it is in ::ffff:0:0/96), not
// as the IPv4 address it maps: a caller that means the IPv4 address unmaps it first.
func Lookup(a netip.Addr) (Block, bool) {
	a = a.WithZone("")
	var best Block
	found := false
	for _, b := range Blocks {
		if b.Prefix.Contains(a) && (!found || b.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = b, true
		}
	}
	return best, found
}

// Metadata lists the cloud metadata endpoints (instance metadata, the platform's wire server) that
// lie outside the refused blocks of Blocks, or inside them but worth naming: a Service that takes one
// over would receive the node's requests for its credentials. Both families; sources are the
// providers' documentation (checked 2026-12). GCP, DigitalOcean, Hetzner, Huawei, Oracle (OCI) and
// OpenStack answer on 169.254.169.254 (OpenStack also on fe80::a9fe:a9fe), both inside refused blocks.
var Metadata = []Block{
	endpoint("169.254.169.254", "cloud metadata (AWS, Azure, GCP, OpenStack and others)", "provider documentation"),
	endpoint("169.254.170.2", "cloud metadata (AWS ECS task metadata and credentials)", "AWS documentation"),
	endpoint("100.100.100.200", "cloud metadata (Alibaba Cloud)", "Alibaba Cloud documentation"),
	endpoint("168.63.129.16", "cloud metadata (Azure WireServer: platform agent, DNS, health probes)", "Azure documentation"),
	endpoint("192.0.0.192", "cloud metadata (Oracle Compute Cloud@Customer)", "Oracle documentation"),
	endpoint("fd00:ec2::254", "cloud metadata (AWS IMDS over IPv6)", "AWS documentation"),
	endpoint("fd20:ce::254", "cloud metadata (GCP metadata server over IPv6)", "GCP documentation"),
	endpoint("fe80::a9fe:a9fe", "cloud metadata (OpenStack over IPv6)", "OpenStack documentation"),
}

// Refusal says why an address is never DNATed.
type Refusal struct {
	// Block is the deciding block: a special-purpose block of Blocks or an endpoint of Metadata.
	// Empty for an invalid address.
	Block Block
	// Metadata: Block is a cloud metadata endpoint.
	Metadata bool
	// Carried is the IPv4 address an IPv6 form carries (Form) when that IPv4 address decided.
	Carried netip.Addr
	// Form names the IPv6 form that carries Carried ("NAT64 well-known prefix", "6to4", ...).
	Form string
}

// String is the reason in words, to follow the address: "is link-local (169.254.0.0/16, RFC 3927)",
// or for an IPv6 form "carries 169.254.169.254 (NAT64 well-known prefix 64:ff9b::/96), which is
// cloud metadata (...) (169.254.169.254/32, provider documentation)".
func (r Refusal) String() string {
	if !r.Block.Prefix.IsValid() {
		return "is not a valid address"
	}
	s := fmt.Sprintf("%s (%s, %s)", r.Block.Name, r.Block.Prefix, r.Block.Ref)
	if r.Carried.IsValid() {
		return fmt.Sprintf("carries %s (%s), which is %s", r.Carried, r.Form, s)
	}
	return "is " + s
}

// NeverDNAT reports whether a must never be taken over as a DNAT destination, and why. It refuses
// the cloud metadata endpoints of Metadata, the refused blocks of Blocks, and an IPv6 address
// that carries an IPv4 address a translator or tunnel delivers to (NAT64 well-known and local-use
// prefixes, 6to4, Teredo; see Embedded) when that IPv4 address is refused. Invalid addresses are
// refused with an empty Refusal.
func NeverDNAT(a netip.Addr) (Refusal, bool) {
	if !a.IsValid() {
		return Refusal{}, true
	}
	a = a.WithZone("")
	for _, m := range Metadata {
		if m.Prefix.Contains(a) {
			return Refusal{Block: m, Metadata: true}, true
		}
	}
	for _, e := range Embedded(a) {
		if thisNetwork.Contains(e.Addr) {
			continue // see Embedded
		}
		if r, refused := NeverDNAT(e.Addr); refused {
			r.Carried, r.Form = e.Addr, e.Form
			return r, true
		}
	}
	if b, ok := Lookup(a); ok && b.Refused {
		return Refusal{Block: b}, true
	}
	return Refusal{}, false
}

// Carried is an IPv4 address inside an IPv6 address, and the form that puts it there.
type Carried struct {
	Addr netip.Addr
	Form string
}

// The IPv6 forms that carry an IPv4 address to which a translator or tunnel relay delivers.
var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052
	nat64LocalUse  = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215
	sixToFour      = netip.MustParsePrefix("2002::/16")      // RFC 3056
	teredo         = netip.MustParsePrefix("2001::/32")      // RFC 4380
	ipv4Mapped     = netip.MustParsePrefix("::ffff:0:0/96")  // RFC 4291
	thisNetwork    = netip.MustParsePrefix("0.0.0.0/8")      // RFC 791
)

// Embedded returns the IPv4 addresses that a carries, by the IPv6 form a is in:
//   - IPv4-mapped ::ffff:0:0/96: the last 32 bits (Blocks refuses the form as a whole anyway);
//   - NAT64 well-known prefix 64:ff9b::/96 (RFC 6052): the last 32 bits;
//   - NAT64 local-use prefix 64:ff9b:1::/48 (RFC 8215): an operator may carve any RFC 6052 prefix
//     length out of it, so every position inside the /48 (/48, /56, /64, /96) for which the address
//     is well formed;
//   - 6to4 2002::/16 (RFC 3056): bits 16-47;
//   - Teredo 2001::/32 (RFC 4380): the server (bits 32-63) and the client (the last 32 bits,
//     inverted).
//
// An address in none of them carries nothing. NeverDNAT ignores a carried address in 0.0.0.0/8: the
// kernel routes nothing there, and the zero padding of the shorter local-use positions reads as one
// (64:ff9b:1:c000:2:a00:: is 192.0.2.10 as /48, 0.2.10.0 as /56).
func Embedded(a netip.Addr) []Carried {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	v4 := func(x [4]byte) netip.Addr { return netip.AddrFrom4(x) }
	switch {
	case ipv4Mapped.Contains(a):
		return []Carried{{v4([4]byte(b[12:16])), "IPv4-mapped"}}
	case nat64WellKnown.Contains(a):
		return []Carried{{v4([4]byte(b[12:16])), "NAT64 well-known prefix 64:ff9b::/96"}}
	case nat64LocalUse.Contains(a):
		// An operator may carve any RFC 6052 prefix out of the /48. A position counts when the
		// address is well formed for it: bits 64-71 (byte 8) zero and the suffix after the IPv4
		// address zero (RFC 6052 section 2.2); the /96 position has no suffix and always counts.
		const form = "NAT64 local-use prefix 64:ff9b:1::/48"
		zero := func(bs []byte) bool { return !slices.ContainsFunc(bs, func(x byte) bool { return x != 0 }) }
		var out []Carried
		if b[8] == 0 && zero(b[11:]) {
			out = append(out, Carried{v4([4]byte{b[6], b[7], b[9], b[10]}), form + " as /48"})
		}
		if b[8] == 0 && zero(b[12:]) {
			out = append(out, Carried{v4([4]byte{b[7], b[9], b[10], b[11]}), form + " as /56"})
		}
		if b[8] == 0 && zero(b[13:]) {
			out = append(out, Carried{v4([4]byte(b[9:13])), form + " as /64"})
		}
		return append(out, Carried{v4([4]byte(b[12:16])), form + " as /96"})
	case sixToFour.Contains(a):
		return []Carried{{v4([4]byte(b[2:6])), "6to4 2002::/16"}}
	case teredo.Contains(a):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return []Carried{{v4([4]byte(b[4:8])), "Teredo server"}, {v4(client), "Teredo client"}}
	}
	return nil
}

// WithinRefused reports whether every address of p is refused by NeverDNAT, and the block that covers
// it: a prefix that can never match an address a fix may take over (e.g. an allow-list entry
// 127.0.0.0/8).
func WithinRefused(p netip.Prefix) (Block, bool) {
	p = p.Masked()
	var outer Block
	found := false
	for _, b := range Blocks {
		if b.Prefix.Bits() <= p.Bits() && b.Prefix.Contains(p.Addr()) && (!found || b.Prefix.Bits() > outer.Prefix.Bits()) {
			outer, found = b, true
		}
	}
	if !found || !outer.Refused {
		return Block{}, false
	}
	// A more specific allowed block inside p lifts the refusal for part of it.
	for _, b := range Blocks {
		if !b.Refused && b.Prefix.Bits() > outer.Prefix.Bits() && p.Overlaps(b.Prefix) {
			return Block{}, false
		}
	}
	return outer, true
}
