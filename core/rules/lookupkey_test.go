package rules

import (
	"net/netip"
	"strings"
	"testing"
)

// TestValidateLookupKey: a lookup by the connection's original destination (issue #41) is valid as a
// match with a conntrack status beside a DNAT by the same map, and refused where it would mean two
// things at once: without a map, as the key of a DNAT, beside a match on the packet's own
// destination, with unknown names, or with no DNAT by its map whose connections it would find.
func TestValidateLookupKey(t *testing.T) {
	rs := func(r Rule) *Ruleset {
		return &Ruleset{Fix: "x", Family: IPv4,
			Maps: []Map{{Name: "svc", Entries: []MapEntry{{Addr: netip.MustParseAddr("203.0.113.1"), Protocol: TCP, Port: 80, To: netip.MustParseAddrPort("10.96.0.1:80")}}}, {Name: "other"}},
			Chains: []Chain{
				{Name: "PRE", Type: NAT, Hook: Prerouting, Rules: []Rule{{Match: Match{Lookup: "svc"}, Verdict: Verdict{Kind: DNATLookup}}}},
				{Name: "POST", Type: NAT, Hook: Postrouting, Rules: []Rule{r}}}}
	}
	masq := Verdict{Kind: Masquerade}
	if err := rs(Rule{Match: Match{CTStatus: CTDNAT, Lookup: "svc", LookupKey: LookupCTOriginal}, Verdict: masq}).Validate(); err != nil {
		t.Errorf("a masquerade by original destination: %v", err)
	}
	for want, r := range map[string]Rule{
		"without a Lookup":         {Match: Match{LookupKey: LookupCTOriginal}, Verdict: masq},
		"packet's destination":     {Match: Match{Lookup: "svc", LookupKey: LookupCTOriginal, Protocol: TCP}, Verdict: masq},
		"unknown lookup key":       {Match: Match{Lookup: "svc", LookupKey: "reply"}, Verdict: masq},
		"unknown conntrack status": {Match: Match{CTStatus: "snat"}, Verdict: masq},
		`map "other", but no dnat-lookup rule translates by it`: {Match: Match{CTStatus: CTDNAT, Lookup: "other", LookupKey: LookupCTOriginal}, Verdict: masq},
	} {
		if err := rs(r).Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error about %q", r.Match, err, want)
		}
	}
	dnat := &Ruleset{Fix: "x", Family: IPv4,
		Maps:   []Map{{Name: "svc"}},
		Chains: []Chain{{Name: "PRE", Type: NAT, Hook: Prerouting, Rules: []Rule{{Match: Match{Lookup: "svc", LookupKey: LookupCTOriginal}, Verdict: Verdict{Kind: DNATLookup}}}}}}
	if err := dnat.Validate(); err == nil || !strings.Contains(err.Error(), "dnat-lookup needs the packet's destination") {
		t.Errorf("a DNAT by original destination: %v", err)
	}
}
