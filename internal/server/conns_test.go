package server

import (
	"net/netip"
	"testing"
)

// One IPv6 /64 is one source; an IPv4 address (also written IPv4-mapped) is one source.
func TestSource(t *testing.T) {
	for _, tc := range []struct{ hostport, want string }{
		{"10.0.0.1:80", "10.0.0.1/32"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1/32"},
		{"[fd00:41::1]:80", "fd00:41::/64"},
		{"[fd00:41::ffff:1:2]:443", "fd00:41::/64"},
		{"[fd00:41:0:1::1]:443", "fd00:41:0:1::/64"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
	} {
		if got := sourceOf(tc.hostport); got != netip.MustParsePrefix(tc.want) {
			t.Errorf("sourceOf(%s) = %s, want %s", tc.hostport, got, tc.want)
		}
	}
	if got := sourceOf("not an address"); got.IsValid() {
		t.Errorf("sourceOf(garbage) = %s, want the zero prefix", got)
	}
}
