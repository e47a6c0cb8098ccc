package rules

import (
	"net/netip"
	"strings"
	"testing"
)

func TestValidInterfacePrefix(t *testing.T) {
	for _, ok := range []string{"cali", "eth0", "veth_a.b@c-d", strings.Repeat("x", MaxInterfacePrefix)} {
		if err := ValidInterfacePrefix(ok); err != nil {
			t.Errorf("ValidInterfacePrefix(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxInterfacePrefix+1), "a/b", "a:b", "a b", "é"} {
		if err := ValidInterfacePrefix(bad); err == nil {
			t.Errorf("ValidInterfacePrefix(%q) = nil, want an error", bad)
		}
	}
}

func TestParsePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0/8":       "10.0.0.0/8",
		" 192.0.2.7 ":      "192.0.2.7/32",
		"2001:db8::1":      "2001:db8::1/128",
		"::ffff:192.0.2.7": "192.0.2.7/32",
		"fd00::/64":        "fd00::/64",
	} {
		got, err := ParsePrefix(in)
		if err != nil || got != netip.MustParsePrefix(want) {
			t.Errorf("ParsePrefix(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"10.0.0.1/8":          "did you mean 10.0.0.0/8",
		"10.0.0.0/33":         "not a CIDR",
		"fe80::1%eth0":        "not a CIDR",
		"::ffff:10.0.0.0/104": "IPv4-mapped",
		"hello":               `"hello"`,
	} {
		if _, err := ParsePrefix(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePrefix(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func TestParsePrefixes(t *testing.T) {
	got, err := ParsePrefixes("k", "", []string{"10.0.0.0/8", "fd00::/8", "10.0.0.0/8"})
	if err != nil || len(got) != 2 {
		t.Errorf("ParsePrefixes = %v, %v; want two prefixes without the duplicate", got, err)
	}
	if _, err := ParsePrefixes("POD_CIDR_IPV4", IPv4, []string{"fd00::/64"}); err == nil || !strings.Contains(err.Error(), "POD_CIDR_IPV4: fd00::/64 is not an ipv4 CIDR") {
		t.Errorf("an IPv6 prefix for an IPv4 key: %v", err)
	}
	if _, err := ParsePrefixes("fixes.x.cidrs", "", []string{"10.0.0.1/24"}); err == nil || !strings.HasPrefix(err.Error(), "fixes.x.cidrs: ") {
		t.Errorf("errors name the key: %v", err)
	}
}

// TestValidateLimits: a Ruleset that a backend cannot render does not validate.
func TestValidateLimits(t *testing.T) {
	rs := func(r Rule, entries ...MapEntry) *Ruleset {
		return &Ruleset{Fix: "x", Family: IPv4, Chains: []Chain{{Name: "C", Type: Filter, Hook: Input, Rules: []Rule{r}}},
			Maps: []Map{{Name: "m", Entries: entries}}}
	}
	drop := Verdict{Kind: Drop}
	if err := rs(Rule{Match: Match{InInterfacePrefix: strings.Repeat("x", MaxInterfacePrefix)}, Verdict: drop}).Validate(); err != nil {
		t.Errorf("a prefix of MaxInterfacePrefix: %v", err)
	}
	for name, bad := range map[string]*Ruleset{
		"long interface prefix": rs(Rule{Match: Match{InInterfacePrefix: strings.Repeat("x", MaxInterfacePrefix+1)}, Verdict: drop}),
		"4in6 source":           rs(Rule{Match: Match{SrcPrefixes: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}, Verdict: drop}),
		"long comment":          rs(Rule{Verdict: drop, Comment: strings.Repeat("c", MaxComment+1)}),
		"set and clear mark":    rs(Rule{SetMark: 0x1000, ClearMark: 0x2000}),
		"long entry comment": rs(Rule{Verdict: drop}, MapEntry{Addr: netip.MustParseAddr("192.0.2.1"), Protocol: TCP, Port: 80,
			To: netip.MustParseAddrPort("10.0.0.1:80"), Comment: strings.Repeat("c", MaxComment+1)}),
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil, want an error", name)
		}
	}
}

// Hook and protocol names are accepted in any case and with surrounding space; an unknown one is
// refused with the list of valid names.
func TestParseHookAndProtocol(t *testing.T) {
	if h, err := ParseHook(" PostRouting "); err != nil || h != Postrouting {
		t.Errorf("ParseHook(PostRouting) = %q, %v", h, err)
	}
	if p, err := ParseProtocol("SCTP"); err != nil || p != SCTP {
		t.Errorf("ParseProtocol(SCTP) = %q, %v", p, err)
	}
	if _, err := ParseHook("ingress"); err == nil || err.Error() != `unknown netfilter hook "ingress" (want prerouting, input, forward, output or postrouting)` {
		t.Errorf("ParseHook(ingress) error = %v", err)
	}
	if _, err := ParseProtocol("icmp"); err == nil || err.Error() != `unknown protocol "icmp" (want tcp, udp or sctp)` {
		t.Errorf("ParseProtocol(icmp) error = %v", err)
	}
	// Only ASCII letters fold (a long s, which strings.EqualFold folds to s, is not an s), and a
	// name is not a prefix of another.
	for _, bad := range []string{"\u017Fctp", "tc", "tcpp", "t\u0000p"} {
		if p, err := ParseProtocol(bad); err == nil {
			t.Errorf("ParseProtocol(%q) = %q, want an error", bad, p)
		}
	}
	if p, err := ParseProtocol("tCp"); err != nil || p != TCP {
		t.Errorf("ParseProtocol(tCp) = %q, %v", p, err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseProtocol("TCP") }); n != 0 {
		t.Errorf("ParseProtocol(TCP) allocates %v times", n)
	}
}
