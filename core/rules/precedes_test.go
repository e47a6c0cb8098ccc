package rules

import (
	"strings"
	"testing"
)

// Chain.Precedes names foreign kernel chains of a hooked chain; anything else is refused with the
// cause named.
func TestValidatePrecedes(t *testing.T) {
	rs := func(c Chain) *Ruleset { return &Ruleset{Fix: "x", Family: IPv4, Chains: []Chain{c}} }
	if err := rs(Chain{Name: "A", Type: NAT, Hook: Prerouting, Precedes: []string{"KUBE-SERVICES", "cali-PREROUTING"}}).Validate(); err != nil {
		t.Fatalf("valid Precedes refused: %v", err)
	}
	for _, tc := range []struct {
		c    Chain
		want string
	}{
		{Chain{Name: "A", Type: NAT, Precedes: []string{"KUBE-SERVICES"}}, "without a Hook"},
		{Chain{Name: "A", Type: NAT, Hook: Prerouting, Precedes: []string{"KUBE SERVICES"}}, "is no chain name"},
		{Chain{Name: "A", Type: NAT, Hook: Prerouting, Precedes: []string{""}}, "is no chain name"},
		{Chain{Name: "A", Type: NAT, Hook: Prerouting, Precedes: []string{strings.Repeat("K", 29)}}, "is no chain name"},
	} {
		err := rs(tc.c).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Precedes %q (hook %q): error %v, want one containing %q", tc.c.Precedes, tc.c.Hook, err, tc.want)
		}
	}
	// Clone copies it: changing the clone leaves the original alone.
	orig := rs(Chain{Name: "A", Type: NAT, Hook: Prerouting, Precedes: []string{"KUBE-SERVICES"}})
	c := orig.Clone()
	c.Chains[0].Precedes[0] = "OTHER"
	if orig.Chains[0].Precedes[0] != "KUBE-SERVICES" || orig.Equal(c) {
		t.Fatalf("Clone shares Precedes or Equal ignores it: %q vs %q", orig.Chains[0].Precedes, c.Chains[0].Precedes)
	}
}
