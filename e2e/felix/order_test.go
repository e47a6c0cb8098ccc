package felix

import "testing"

// TestParseOrder pins what the order snapshot keeps: base chains with hook and priority and the
// jumps of their rules in kernel order; regular chains and verdict-only rules are left out.
func TestParseOrder(t *testing.T) {
	const listing = `table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		 counter packets 10 bytes 600 jump cali-INPUT
		 counter packets 3 bytes 180 jump NNM-INVALID-DROP
	}
	chain cali-INPUT {
		 counter packets 0 bytes 0 goto cali-from-host-endpoint
	}
}
table ip6 nnm-invalid-drop {
	chain input {
		type filter hook input priority filter - 5; policy accept;
		ct state invalid counter packets 1 bytes 60 drop
	}
}
table ip calico {
	chain filter-INPUT {
		type filter hook input priority filter; policy accept;
		jump filter-cali-INPUT
	}
}
`
	got := parseOrder(listing).String()
	want := "  ip calico filter-INPUT [filter input filter]: filter-cali-INPUT\n" +
		"  ip filter INPUT [filter input filter]: cali-INPUT NNM-INVALID-DROP\n" +
		"  ip6 nnm-invalid-drop input [filter input filter - 5]: "
	if got != want {
		t.Fatalf("parseOrder:\n%s\nwant:\n%s", got, want)
	}
	swapped := parseOrder(`table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		 counter packets 0 bytes 0 jump NNM-INVALID-DROP
		 counter packets 0 bytes 0 jump cali-INPUT
	}
}
`)
	if swapped.String() == parseOrder(listing).String() {
		t.Fatal("a swapped jump order compares equal")
	}
	if err := parseOrder(listing).hasBoth("ip"); err != nil {
		t.Fatal(err)
	}
	if err := parseOrder(listing).hasBoth("ip6"); err == nil {
		t.Fatal("ip6 has no Felix rules, but hasBoth accepted it")
	}
}
