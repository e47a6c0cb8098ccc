package connlabel

import (
	"fmt"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestBook: a (fix, map) pair keeps its bit; pairs get distinct bits within [First, End), the one
// a pair hashes to taken already or not; the pair after the last bit gets an error that names it.
func TestBook(t *testing.T) {
	b := NewBook()
	seen := map[int]string{}
	for i := range End - First {
		m := fmt.Sprintf("map-%d", i)
		bit, err := b.Bit("fix", m)
		if err != nil {
			t.Fatal(err)
		}
		if bit < First || bit >= End {
			t.Fatalf("%s: bit %d outside [%d, %d)", m, bit, First, End)
		}
		if other, ok := seen[bit]; ok {
			t.Fatalf("%s and %s share bit %d", m, other, bit)
		}
		seen[bit] = m
		if again, _ := b.Bit("fix", m); again != bit {
			t.Fatalf("%s: bit %d, then %d", m, bit, again)
		}
	}
	if _, err := b.Bit("fix", "one-too-many"); err == nil || !strings.Contains(err.Error(), "fix/one-too-many") {
		t.Fatalf("the %dth map: %v, want an error naming it", End-First+1, err)
	}
}

// TestOf: a DNAT by a map gets the map's bit only when some rule finds that map's connections by
// original destination; that lookup gets the same bit; other rules get none.
func TestOf(t *testing.T) {
	dnat := rules.Rule{Match: rules.Match{Lookup: "m"}, Verdict: rules.Verdict{Kind: rules.DNATLookup}}
	masq := rules.Rule{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: "m", LookupKey: rules.LookupCTOriginal}, Verdict: rules.Verdict{Kind: rules.Masquerade}}
	plain := rules.Rule{Match: rules.Match{Lookup: "m"}, Verdict: rules.Verdict{Kind: rules.Accept}}
	with := &rules.Ruleset{Fix: "connlabel-test", Family: rules.IPv4, Maps: []rules.Map{{Name: "m"}},
		Chains: []rules.Chain{{Name: "c", Rules: []rules.Rule{dnat, masq, plain}}}}
	without := &rules.Ruleset{Fix: "connlabel-test", Family: rules.IPv4, Maps: []rules.Map{{Name: "m"}},
		Chains: []rules.Chain{{Name: "c", Rules: []rules.Rule{dnat, plain}}}}
	want, err := Bit("connlabel-test", "m")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		rs   *rules.Ruleset
		r    rules.Rule
		want int
	}{
		{"dnat, found again", with, dnat, want},
		{"the lookup by original destination", with, masq, want},
		{"another lookup of the map", with, plain, 0},
		{"dnat, never found again", without, dnat, 0},
	} {
		got, err := Of(c.rs, c.r)
		if err != nil || got != c.want {
			t.Errorf("%s: %d, %v; want %d", c.name, got, err, c.want)
		}
	}
}
