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
// address-space registries, the IPv4-compatible form from RFC 4291 section 2.5.5.1.
package netaddr

import (
	"net/netip"
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

// NeverDNAT reports whether a must never be taken over as a DNAT destination, and the block that
// says so. Invalid addresses are refused with an empty block.
func NeverDNAT(a netip.Addr) (Block, bool) {
	if !a.IsValid() {
		return Block{}, true
	}
	b, ok := Lookup(a)
	return b, ok && b.Refused
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
