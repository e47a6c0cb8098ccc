package rules

import (
	"net/netip"
	"slices"
	"testing"
)

func TestDiffEntries(t *testing.T) {
	e := func(addr string, port uint16, to string) MapEntry {
		return MapEntry{Addr: netip.MustParseAddr(addr), Protocol: TCP, Port: port, To: netip.MustParseAddrPort(to)}
	}
	old := []MapEntry{e("192.0.2.1", 80, "10.96.0.1:80"), e("192.0.2.2", 80, "10.96.0.2:80"), e("192.0.2.3", 443, "10.96.0.3:443")}
	now := []MapEntry{e("192.0.2.2", 80, "10.96.0.9:80"), e("192.0.2.3", 443, "10.96.0.3:443"), e("192.0.2.4", 53, "10.96.0.4:53")}
	var got []string
	DiffEntries(old, now,
		func(e MapEntry) { got = append(got, "gone "+e.Addr.String()) },
		func(e MapEntry) { got = append(got, "added "+e.Addr.String()) },
		func(was, is MapEntry) { got = append(got, "changed "+was.To.String()+" -> "+is.To.String()) })
	want := []string{"gone 192.0.2.1", "changed 10.96.0.2:80 -> 10.96.0.9:80", "added 192.0.2.4"}
	if !slices.Equal(got, want) {
		t.Fatalf("DiffEntries calls = %q, want %q", got, want)
	}
	DiffEntries(now, now, func(MapEntry) { t.Error("gone called for equal lists") },
		func(MapEntry) { t.Error("added called for equal lists") }, func(_, _ MapEntry) { t.Error("changed called for equal lists") })
}
