package rules

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestNeverDNAT(t *testing.T) {
	cases := []struct {
		addr    string
		refused bool
		block   string // name of the deciding block, "" for ordinary unicast
	}{
		// IPv4: refused.
		{"0.0.0.0", true, "this host on this network (unspecified)"},
		{"0.1.2.3", true, "this network"},
		{"127.0.0.1", true, "loopback"},
		{"127.255.255.254", true, "loopback"},
		{"169.254.169.254", true, "link-local"},
		{"169.254.0.1", true, "link-local"},
		{"192.0.0.8", true, "IPv4 dummy address"},
		{"192.0.0.11", true, "IETF protocol assignments"},
		{"192.0.0.170", true, "NAT64/DNS64 discovery"},
		{"192.0.0.171", true, "NAT64/DNS64 discovery"},
		{"224.0.0.1", true, "multicast"},
		{"239.255.255.250", true, "multicast"},
		{"240.0.0.1", true, "reserved"},
		{"255.255.255.254", true, "reserved"},
		{"255.255.255.255", true, "limited broadcast"},
		// IPv4: allowed (LoadBalancer pools are made of these).
		{"10.0.0.1", false, "private-use"},
		{"172.16.5.4", false, "private-use"},
		{"192.168.1.1", false, "private-use"},
		{"100.64.0.1", false, "shared address space"},
		{"100.127.255.254", false, "shared address space"},
		{"198.18.0.1", false, "benchmarking"},
		{"192.0.0.1", false, "IPv4 service continuity prefix"},
		{"192.0.0.9", false, "port control protocol anycast"},
		{"192.0.0.10", false, "traversal using relays around NAT anycast"},
		{"192.0.2.1", false, "documentation (TEST-NET-1)"},
		{"198.51.100.1", false, "documentation (TEST-NET-2)"},
		{"203.0.113.10", false, "documentation (TEST-NET-3)"},
		{"8.8.8.8", false, ""},
		{"1.0.0.1", false, ""},
		{"169.253.255.255", false, ""},
		{"169.255.0.0", false, ""},
		{"223.255.255.255", false, ""},
		{"126.255.255.255", false, ""},
		{"128.0.0.0", false, ""},
		// IPv6: refused.
		{"::", true, "unspecified"},
		{"::1", true, "loopback"},
		{"::2", true, "deprecated IPv4-compatible"},
		{"::7f00:1", true, "deprecated IPv4-compatible"},
		{"::ffff:127.0.0.1", true, "IPv4-mapped"}, // decided by what it carries: loopback
		{"::ffff:203.0.113.10", true, "IPv4-mapped"},
		{"fe80::1", true, "link-local unicast"},
		{"febf:ffff::1", true, "link-local unicast"},
		{"ff02::1", true, "multicast"},
		{"ff05::1:3", true, "multicast"},
		{"100:0:0:1::1", true, "dummy IPv6 prefix"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", false, "TEREDO"}, // RFC 4380's server 65.54.227.120, client 192.0.2.45
		{"2001:5::1", true, "IETF protocol assignments"},
		{"2001:1::4", true, "IETF protocol assignments"},
		{"2001:10::1", true, "deprecated ORCHID"},
		// IPv6: allowed.
		{"2001:db8::1", false, "documentation"},
		{"3fff::1", false, "documentation"},
		{"fd00:10:96::1", false, "unique-local"},
		{"fc00::1", false, "unique-local"},
		{"64:ff9b::1.2.3.4", false, "IPv4-IPv6 translation"},
		{"64:ff9b:1::c000:20a", false, "local-use IPv4/IPv6 translation"},
		{"100::1", false, "discard-only"},
		{"2001:1::1", false, "port control protocol anycast"},
		{"2001:2::1", false, "benchmarking"},
		{"2001:20::1", false, "ORCHIDv2"},
		{"2002:c000:0204::1", false, "6to4"},
		{"5f00::1", false, "segment routing (SRv6) SIDs"},
		{"2600::1", false, ""},
		{"fec0::1", true, "deprecated site-local unicast"},
		{"feff:ffff::1", true, "deprecated site-local unicast"},
		{"fe7f:ffff::1", false, ""},
		{"ff00::", true, "multicast"},
		{"::1:0:0:0", false, ""},
	}
	for _, tc := range cases {
		a := netip.MustParseAddr(tc.addr)
		r, refused := NeverDNAT(a)
		b := r.Block
		if refused != tc.refused {
			t.Errorf("NeverDNAT(%s) = %v (block %q), want %v", tc.addr, refused, b.Name, tc.refused)
		}
		got, _ := LookupAddr(a)
		if got.Name != tc.block {
			t.Errorf("Lookup(%s) = %q (%s), want %q", tc.addr, got.Name, got.Prefix, tc.block)
		}
		if refused && !r.Metadata && !r.Carried.IsValid() && b.Name != tc.block {
			t.Errorf("NeverDNAT(%s) names %q, want %q", tc.addr, b.Name, tc.block)
		}
		if refused && (b.Name == "" || b.Ref == "") {
			t.Errorf("NeverDNAT(%s) refuses without naming the block: %+v", tc.addr, b)
		}
	}
	if _, refused := NeverDNAT(netip.Addr{}); !refused {
		t.Error("NeverDNAT(invalid) allowed")
	}
	// A zone does not hide a link-local address.
	if _, refused := NeverDNAT(netip.MustParseAddr("fe80::1%eth0")); !refused {
		t.Errorf("NeverDNAT(%s) allowed", "fe80::1%eth0")
	}
}

// TestNeverDNATMetadataAndEmbedded (issue #19 item 2): the cloud metadata endpoints outside the
// IANA blocks are refused, and so is every IPv6 form that carries a refused IPv4 address to a
// translator or tunnel relay, judged by that IPv4 address; the same forms carrying an ordinary
// address stay allowed.
func TestNeverDNATMetadataAndEmbedded(t *testing.T) {
	cases := []struct {
		addr     string
		refused  bool
		metadata bool   // refused as a metadata endpoint
		carried  string // the IPv4 address that decided, "" when the address itself decided
	}{
		{"100.100.100.200", true, true, ""},  // Alibaba, inside the allowed shared space
		{"168.63.129.16", true, true, ""},    // Azure WireServer, public space
		{"fd00:ec2::254", true, true, ""},    // AWS IMDS over IPv6, unique-local space
		{"169.254.169.254", true, true, ""},  // named as metadata, not only link-local
		{"fe80::a9fe:a9fe", true, true, ""},  // OpenStack over IPv6
		{"fec0::a9fe:a9fe", true, false, ""}, // site-local
		{"100.100.100.201", false, false, ""},
		{"168.63.129.17", false, false, ""},
		{"fd00:ec2::255", false, false, ""},
		// NAT64 well-known prefix (RFC 6052 /96).
		{"64:ff9b::a9fe:a9fe", true, true, "169.254.169.254"},
		{"64:ff9b::7f00:1", true, false, "127.0.0.1"},
		{"64:ff9b::6464:64c8", true, true, "100.100.100.200"},
		{"64:ff9b::a83f:8110", true, true, "168.63.129.16"},
		{"64:ff9b::c000:20a", false, false, ""}, // 192.0.2.10
		// NAT64 local-use prefix (RFC 8215), every RFC 6052 length inside the /48.
		{"64:ff9b:1:a9fe:a9:fe00::", true, true, "169.254.169.254"},  // as /48
		{"64:ff9b:1:a9:fe:a9fe::", true, true, "169.254.169.254"},    // as /56
		{"64:ff9b:1::a9:fea9:fe00:0", true, true, "169.254.169.254"}, // as /64
		{"64:ff9b:1::a9fe:a9fe", true, true, "169.254.169.254"},      // as /96
		{"64:ff9b:1::c000:20a", false, false, ""},
		{"64:ff9b:1:c000:2:a00::", false, false, ""}, // 192.0.2.10 as /48
		// 6to4.
		{"2002:a9fe:a9fe::1", true, true, "169.254.169.254"},
		{"2002:7f00:1::", true, false, "127.0.0.1"},
		{"2002:c000:20a::1", false, false, ""},
		// Teredo: the server, and the client (inverted).
		{"2001:0:a9fe:a9fe::1", true, true, "169.254.169.254"},
		{"2001:0:c000:20a:0:0:5601:5601", true, true, "169.254.169.254"}, // client ^0x5601 5601
		{"2001:0:c000:20a::3fff:f5f5", false, false, ""},                 // client 192.0.10.10
		// IPv4-mapped: named by what it carries when that is refused, else refused as a form.
		{"::ffff:169.254.169.254", true, true, "169.254.169.254"},
		{"::ffff:203.0.113.10", true, false, ""},
	}
	for _, tc := range cases {
		r, refused := NeverDNAT(netip.MustParseAddr(tc.addr))
		if refused != tc.refused || r.Metadata != tc.metadata {
			t.Errorf("NeverDNAT(%s) = %v, metadata %v (%s), want %v, metadata %v", tc.addr, refused, r.Metadata, r, tc.refused, tc.metadata)
			continue
		}
		var carried string
		if r.Carried.IsValid() {
			carried = r.Carried.String()
		}
		if carried != tc.carried {
			t.Errorf("NeverDNAT(%s) decided by %q (%s), want %q", tc.addr, carried, r, tc.carried)
		}
		if tc.carried != "" && (r.Form == "" || !strings.Contains(r.String(), tc.carried)) {
			t.Errorf("NeverDNAT(%s) = %q names neither the form nor the carried address", tc.addr, r)
		}
	}
}

func TestWithinRefused(t *testing.T) {
	cases := []struct {
		prefix string
		want   bool
	}{
		{"127.0.0.0/8", true},
		{"127.0.0.1/32", true},
		{"169.254.169.254/32", true},
		{"0.0.0.0/8", true},
		{"224.0.0.0/4", true},
		{"224.0.0.0/24", true},
		{"240.0.0.0/4", true},
		{"fe80::/10", true},
		{"fe80::/64", true},
		{"ff00::/8", true},
		{"::1/128", true},
		{"::ffff:0:0/96", true},
		// Partly allowed, or not special at all.
		{"0.0.0.0/0", false},
		{"::/0", false},
		{"::/8", false},
		{"192.0.0.0/24", false}, // the /29 and the anycast addresses are allowed
		{"192.0.0.128/25", true},
		{"2001::/23", false},
		{"2001:10::/28", true},
		{"10.0.0.0/8", false},
		{"100.64.0.0/10", false},
		{"203.0.113.0/24", false},
		{"224.0.0.0/3", false},
		{"2001:db8::/32", false},
	}
	for _, tc := range cases {
		b, got := WithinRefused(netip.MustParsePrefix(tc.prefix))
		if got != tc.want {
			t.Errorf("WithinRefused(%s) = %v (block %q), want %v", tc.prefix, got, b.Name, tc.want)
		}
	}
}

// TestTable checks the table itself: canonical prefixes, no block listed twice, a name and a
// reference for each.
func TestTable(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for _, b := range MetadataAddrs {
		if !b.Refused || b.Prefix.Bits() != b.Prefix.Addr().BitLen() {
			t.Errorf("metadata endpoint %s must be a refused single address", b.Prefix)
		}
	}
	for _, b := range append(slices.Clone(AddrBlocks), MetadataAddrs...) {
		if b.Prefix != b.Prefix.Masked() {
			t.Errorf("%s has host bits set", b.Prefix)
		}
		if seen[b.Prefix] {
			t.Errorf("%s listed twice", b.Prefix)
		}
		seen[b.Prefix] = true
		if b.Name == "" || b.Ref == "" {
			t.Errorf("%s lacks a name or a reference", b.Prefix)
		}
	}
}
