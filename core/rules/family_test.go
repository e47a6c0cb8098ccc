package rules

import (
	"net/netip"
	"slices"
	"testing"
)

func TestFamilyPrefixesAndAddrs(t *testing.T) {
	prefixes := []netip.Prefix{
		netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::ffff:192.0.2.0/120"), netip.MustParsePrefix("192.168.0.0/16"),
	}
	// An IPv4-mapped IPv6 prefix counts as IPv4 (Contains); the order of the list is kept.
	if got, want := IPv4.Prefixes(prefixes), []netip.Prefix{prefixes[1], prefixes[2], prefixes[3]}; !slices.Equal(got, want) {
		t.Errorf("IPv4.Prefixes = %v, want %v", got, want)
	}
	if got, want := IPv6.Prefixes(prefixes), prefixes[:1]; !slices.Equal(got, want) {
		t.Errorf("IPv6.Prefixes = %v, want %v", got, want)
	}
	if got := IPv6.Prefixes(prefixes[1:2]); got != nil {
		t.Errorf("IPv6.Prefixes of IPv4 only = %v, want nil", got)
	}
	addrs := []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00::2")}
	if got, want := IPv6.Addrs(addrs), []netip.Addr{addrs[0], addrs[2]}; !slices.Equal(got, want) {
		t.Errorf("IPv6.Addrs = %v, want %v", got, want)
	}
	if got, want := IPv4.Addrs(addrs), addrs[1:2]; !slices.Equal(got, want) {
		t.Errorf("IPv4.Addrs = %v, want %v", got, want)
	}
}
