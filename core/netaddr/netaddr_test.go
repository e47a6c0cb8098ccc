package netaddr

import (
	"net/netip"
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
		{"::ffff:127.0.0.1", true, "IPv4-mapped"},
		{"::ffff:203.0.113.10", true, "IPv4-mapped"},
		{"fe80::1", true, "link-local unicast"},
		{"febf:ffff::1", true, "link-local unicast"},
		{"ff02::1", true, "multicast"},
		{"ff05::1:3", true, "multicast"},
		{"100:0:0:1::1", true, "dummy IPv6 prefix"},
		{"2001:0:8000::1", false, "TEREDO"},
		{"2001:5::1", true, "IETF protocol assignments"},
		{"2001:1::4", true, "IETF protocol assignments"},
		{"2001:10::1", true, "deprecated ORCHID"},
		// IPv6: allowed.
		{"2001:db8::1", false, "documentation"},
		{"3fff::1", false, "documentation"},
		{"fd00:10:96::1", false, "unique-local"},
		{"fc00::1", false, "unique-local"},
		{"64:ff9b::1.2.3.4", false, "IPv4-IPv6 translation"},
		{"64:ff9b:1::1", false, "local-use IPv4/IPv6 translation"},
		{"100::1", false, "discard-only"},
		{"2001:1::1", false, "port control protocol anycast"},
		{"2001:2::1", false, "benchmarking"},
		{"2001:20::1", false, "ORCHIDv2"},
		{"2002:c000:0204::1", false, "6to4"},
		{"5f00::1", false, "segment routing (SRv6) SIDs"},
		{"2600::1", false, ""},
		{"fec0::1", false, ""},
		{"fe7f:ffff::1", false, ""},
		{"fec0::", false, ""},
		{"::1:0:0:0", false, ""},
	}
	for _, tc := range cases {
		a := netip.MustParseAddr(tc.addr)
		b, refused := NeverDNAT(a)
		if refused != tc.refused {
			t.Errorf("NeverDNAT(%s) = %v (block %q), want %v", tc.addr, refused, b.Name, tc.refused)
		}
		got, _ := Lookup(a)
		if got.Name != tc.block {
			t.Errorf("Lookup(%s) = %q (%s), want %q", tc.addr, got.Name, got.Prefix, tc.block)
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
	for _, b := range Blocks {
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
