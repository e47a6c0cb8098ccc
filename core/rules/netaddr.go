// Which IP addresses have a meaning of their own that a node must never hand to
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

package rules

import (
	"fmt"
	"net/netip"
	"slices"
)

// AddrBlock is one entry of the table of special-purpose addresses (AddrBlocks).
type AddrBlock struct {
	Prefix netip.Prefix
	// Name is the registry's name of the block, used in skip details and logs.
	Name string
	// Refused says the block's addresses must never be DNATed.
	Refused bool
	// Ref is the RFC or registry that defines the block.
	Ref string
}

func addrBlock(prefix, name string, refused bool, ref string) AddrBlock {
	return AddrBlock{Prefix: netip.MustParsePrefix(prefix), Name: name, Refused: refused, Ref: ref}
}

// endpoint is an entry of Metadata: a single address, always refused.
func addrEndpoint(addr, name, ref string) AddrBlock {
	a := netip.MustParseAddr(addr)
	return AddrBlock{Prefix: netip.PrefixFrom(a, a.BitLen()), Name: name, Refused: true, Ref: ref}
}

const (
	refuseDNAT = true
	allowDNAT  = false
)

// AddrBlocks is the table, in registry order. Entries marked allow are listed where a more specific
// block lifts a refusal (192.0.0.0/24, 2001::/23) or where the choice is worth stating.
var AddrBlocks = []AddrBlock{
	// IPv4 special-purpose registry.
	addrBlock("0.0.0.0/8", "this network", refuseDNAT, "RFC 791"),
	addrBlock("0.0.0.0/32", "this host on this network (unspecified)", refuseDNAT, "RFC 1122"),
	addrBlock("10.0.0.0/8", "private-use", allowDNAT, "RFC 1918"),
	addrBlock("100.64.0.0/10", "shared address space", allowDNAT, "RFC 6598"),
	addrBlock("127.0.0.0/8", "loopback", refuseDNAT, "RFC 1122"),
	addrBlock("169.254.0.0/16", "link-local", refuseDNAT, "RFC 3927"),
	addrBlock("172.16.0.0/12", "private-use", allowDNAT, "RFC 1918"),
	addrBlock("192.0.0.0/24", "IETF protocol assignments", refuseDNAT, "RFC 6890"),
	addrBlock("192.0.0.0/29", "IPv4 service continuity prefix", allowDNAT, "RFC 7335"),
	addrBlock("192.0.0.8/32", "IPv4 dummy address", refuseDNAT, "RFC 7600"),
	addrBlock("192.0.0.9/32", "port control protocol anycast", allowDNAT, "RFC 7723"),
	addrBlock("192.0.0.10/32", "traversal using relays around NAT anycast", allowDNAT, "RFC 8155"),
	addrBlock("192.0.0.170/31", "NAT64/DNS64 discovery", refuseDNAT, "RFC 8880"),
	addrBlock("192.0.2.0/24", "documentation (TEST-NET-1)", allowDNAT, "RFC 5737"),
	addrBlock("192.31.196.0/24", "AS112-v4", allowDNAT, "RFC 7535"),
	addrBlock("192.52.193.0/24", "automatic multicast tunneling", allowDNAT, "RFC 7450"),
	addrBlock("192.88.99.0/24", "deprecated 6to4 relay anycast", allowDNAT, "RFC 7526"),
	addrBlock("192.168.0.0/16", "private-use", allowDNAT, "RFC 1918"),
	addrBlock("192.175.48.0/24", "direct delegation AS112 service", allowDNAT, "RFC 7534"),
	addrBlock("198.18.0.0/15", "benchmarking", allowDNAT, "RFC 2544"),
	addrBlock("198.51.100.0/24", "documentation (TEST-NET-2)", allowDNAT, "RFC 5737"),
	addrBlock("203.0.113.0/24", "documentation (TEST-NET-3)", allowDNAT, "RFC 5737"),
	addrBlock("240.0.0.0/4", "reserved", refuseDNAT, "RFC 1112"),
	addrBlock("255.255.255.255/32", "limited broadcast", refuseDNAT, "RFC 919"),
	// IPv4 address space registry.
	addrBlock("224.0.0.0/4", "multicast", refuseDNAT, "RFC 5771"),

	// IPv6 special-purpose registry.
	addrBlock("::1/128", "loopback", refuseDNAT, "RFC 4291"),
	addrBlock("::/128", "unspecified", refuseDNAT, "RFC 4291"),
	addrBlock("::ffff:0:0/96", "IPv4-mapped", refuseDNAT, "RFC 4291"),
	addrBlock("64:ff9b::/96", "IPv4-IPv6 translation", allowDNAT, "RFC 6052"),
	addrBlock("64:ff9b:1::/48", "local-use IPv4/IPv6 translation", allowDNAT, "RFC 8215"),
	addrBlock("100::/64", "discard-only", allowDNAT, "RFC 6666"),
	addrBlock("100:0:0:1::/64", "dummy IPv6 prefix", refuseDNAT, "RFC 9780"),
	addrBlock("2001::/23", "IETF protocol assignments", refuseDNAT, "RFC 2928"),
	addrBlock("2001::/32", "TEREDO", allowDNAT, "RFC 4380"),
	addrBlock("2001:1::1/128", "port control protocol anycast", allowDNAT, "RFC 7723"),
	addrBlock("2001:1::2/128", "traversal using relays around NAT anycast", allowDNAT, "RFC 8155"),
	addrBlock("2001:1::3/128", "DNS-SD service registration protocol anycast", allowDNAT, "RFC 9665"),
	addrBlock("2001:2::/48", "benchmarking", allowDNAT, "RFC 5180"),
	addrBlock("2001:3::/32", "automatic multicast tunneling", allowDNAT, "RFC 7450"),
	addrBlock("2001:4:112::/48", "AS112-v6", allowDNAT, "RFC 7535"),
	addrBlock("2001:10::/28", "deprecated ORCHID", refuseDNAT, "RFC 4843"),
	addrBlock("2001:20::/28", "ORCHIDv2", allowDNAT, "RFC 7343"),
	addrBlock("2001:30::/28", "drone remote ID protocol entity tags", allowDNAT, "RFC 9374"),
	addrBlock("2001:db8::/32", "documentation", allowDNAT, "RFC 3849"),
	addrBlock("2002::/16", "6to4", allowDNAT, "RFC 3056"),
	addrBlock("2620:4f:8000::/48", "direct delegation AS112 service", allowDNAT, "RFC 7534"),
	addrBlock("3fff::/20", "documentation", allowDNAT, "RFC 9637"),
	addrBlock("5f00::/16", "segment routing (SRv6) SIDs", allowDNAT, "RFC 9602"),
	addrBlock("fc00::/7", "unique-local", allowDNAT, "RFC 4193"),
	addrBlock("fe80::/10", "link-local unicast", refuseDNAT, "RFC 4291"),
	addrBlock("fec0::/10", "deprecated site-local unicast", refuseDNAT, "RFC 3879"),
	// IPv6 addressing architecture.
	addrBlock("::/96", "deprecated IPv4-compatible", refuseDNAT, "RFC 4291"),
	addrBlock("ff00::/8", "multicast", refuseDNAT, "RFC 4291"),
}

// LookupAddr returns the most specific block of the table that contains a, and false when a is in none
// (ordinary unicast space). An IPv4-mapped address is looked up as such (it is in ::ffff:0:0/96), not
// as the IPv4 address it maps: a caller that means the IPv4 address unmaps it first.
func LookupAddr(a netip.Addr) (AddrBlock, bool) {
	a = a.WithZone("")
	var best AddrBlock
	found := false
	for _, b := range AddrBlocks {
		if b.Prefix.Contains(a) && (!found || b.Prefix.Bits() > best.Prefix.Bits()) {
			best, found = b, true
		}
	}
	return best, found
}

// MetadataAddrs lists the cloud metadata endpoints (instance metadata, the platform's wire server) that
// lie outside the refused blocks of Blocks, or inside them but worth naming: a Service that takes one
// over would receive the node's requests for its credentials. Both families; sources are the
// providers' documentation (checked 2026-12). GCP, DigitalOcean, Hetzner, Huawei, Oracle (OCI) and
// OpenStack answer on 169.254.169.254 (OpenStack also on fe80::a9fe:a9fe), both inside refused blocks.
var MetadataAddrs = []AddrBlock{
	addrEndpoint("169.254.169.254", "cloud metadata (AWS, Azure, GCP, OpenStack and others)", "provider documentation"),
	addrEndpoint("169.254.170.2", "cloud metadata (AWS ECS task metadata and credentials)", "AWS documentation"),
	addrEndpoint("100.100.100.200", "cloud metadata (Alibaba Cloud)", "Alibaba Cloud documentation"),
	addrEndpoint("168.63.129.16", "cloud metadata (Azure WireServer: platform agent, DNS, health probes)", "Azure documentation"),
	addrEndpoint("192.0.0.192", "cloud metadata (Oracle Compute Cloud@Customer)", "Oracle documentation"),
	addrEndpoint("fd00:ec2::254", "cloud metadata (AWS IMDS over IPv6)", "AWS documentation"),
	addrEndpoint("fd20:ce::254", "cloud metadata (GCP metadata server over IPv6)", "GCP documentation"),
	addrEndpoint("fe80::a9fe:a9fe", "cloud metadata (OpenStack over IPv6)", "OpenStack documentation"),
}

// DNATRefusal says why an address is never DNATed.
type DNATRefusal struct {
	// Block is the deciding block: a special-purpose block of Blocks or an endpoint of Metadata.
	// Empty for an invalid address.
	Block AddrBlock
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
func (r DNATRefusal) String() string {
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
func NeverDNAT(a netip.Addr) (DNATRefusal, bool) {
	if !a.IsValid() {
		return DNATRefusal{}, true
	}
	a = a.WithZone("")
	for _, m := range MetadataAddrs {
		if m.Prefix.Contains(a) {
			return DNATRefusal{Block: m, Metadata: true}, true
		}
	}
	for _, e := range EmbeddedAddrs(a) {
		if thisNetwork.Contains(e.Addr) {
			continue // see Embedded
		}
		if r, refused := NeverDNAT(e.Addr); refused {
			r.Carried, r.Form = e.Addr, e.Form
			return r, true
		}
	}
	if b, ok := LookupAddr(a); ok && b.Refused {
		return DNATRefusal{Block: b}, true
	}
	return DNATRefusal{}, false
}

// CarriedAddr is an IPv4 address inside an IPv6 address, and the form that puts it there.
type CarriedAddr struct {
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

// EmbeddedAddrs returns the IPv4 addresses that a carries, by the IPv6 form a is in:
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
func EmbeddedAddrs(a netip.Addr) []CarriedAddr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	v4 := func(x [4]byte) netip.Addr { return netip.AddrFrom4(x) }
	switch {
	case ipv4Mapped.Contains(a):
		return []CarriedAddr{{v4([4]byte(b[12:16])), "IPv4-mapped"}}
	case nat64WellKnown.Contains(a):
		return []CarriedAddr{{v4([4]byte(b[12:16])), "NAT64 well-known prefix 64:ff9b::/96"}}
	case nat64LocalUse.Contains(a):
		// An operator may carve any RFC 6052 prefix out of the /48. A position counts when the
		// address is well formed for it: bits 64-71 (byte 8) zero and the suffix after the IPv4
		// address zero (RFC 6052 section 2.2); the /96 position has no suffix and always counts.
		const form = "NAT64 local-use prefix 64:ff9b:1::/48"
		zero := func(bs []byte) bool { return !slices.ContainsFunc(bs, func(x byte) bool { return x != 0 }) }
		var out []CarriedAddr
		if b[8] == 0 && zero(b[11:]) {
			out = append(out, CarriedAddr{v4([4]byte{b[6], b[7], b[9], b[10]}), form + " as /48"})
		}
		if b[8] == 0 && zero(b[12:]) {
			out = append(out, CarriedAddr{v4([4]byte{b[7], b[9], b[10], b[11]}), form + " as /56"})
		}
		if b[8] == 0 && zero(b[13:]) {
			out = append(out, CarriedAddr{v4([4]byte(b[9:13])), form + " as /64"})
		}
		return append(out, CarriedAddr{v4([4]byte(b[12:16])), form + " as /96"})
	case sixToFour.Contains(a):
		return []CarriedAddr{{v4([4]byte(b[2:6])), "6to4 2002::/16"}}
	case teredo.Contains(a):
		client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		return []CarriedAddr{{v4([4]byte(b[4:8])), "Teredo server"}, {v4(client), "Teredo client"}}
	}
	return nil
}

// WithinRefused reports whether every address of p is refused by NeverDNAT, and the block that covers
// it: a prefix that can never match an address a fix may take over (e.g. an allow-list entry
// 127.0.0.0/8).
func WithinRefused(p netip.Prefix) (AddrBlock, bool) {
	p = p.Masked()
	var outer AddrBlock
	found := false
	for _, b := range AddrBlocks {
		if b.Prefix.Bits() <= p.Bits() && b.Prefix.Contains(p.Addr()) && (!found || b.Prefix.Bits() > outer.Prefix.Bits()) {
			outer, found = b, true
		}
	}
	if !found || !outer.Refused {
		return AddrBlock{}, false
	}
	// A more specific allowed block inside p lifts the refusal for part of it.
	for _, b := range AddrBlocks {
		if !b.Refused && b.Prefix.Bits() > outer.Prefix.Bits() && p.Overlaps(b.Prefix) {
			return AddrBlock{}, false
		}
	}
	return outer, true
}
