package core

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

type countingCleaner map[rules.Family]int

func (c countingCleaner) CleanupPredecessor(_ context.Context, f rules.Family) (int, error) {
	if n := c[f]; n >= 0 {
		return n, nil
	}
	return 0, errors.New("xtables lock")
}

// The takeover is told (PredecessorTakenOver) with the chains removed and the families they were
// in, and only when there was something to take over.
func TestTakeoverTold(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cleaner  countingCleaner
		told     bool
		chains   int
		families []rules.Family
	}{
		{"both", countingCleaner{rules.IPv4: 3, rules.IPv6: 1}, true, 4, []rules.Family{rules.IPv4, rules.IPv6}},
		{"v4 only, v6 failing", countingCleaner{rules.IPv4: 2, rules.IPv6: -1}, true, 2, []rules.Family{rules.IPv4}},
		{"nothing there", countingCleaner{rules.IPv4: 0, rules.IPv6: 0}, false, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			told, chains := false, 0
			var fams []rules.Family
			tk := &takeover{pc: tc.cleaner, families: rules.Families, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
				takenOver: func(n int, f []rules.Family) { told, chains, fams = true, n, f }}
			tk.clean(context.Background())
			if told != tc.told || chains != tc.chains || !slices.Equal(fams, tc.families) {
				t.Fatalf("told=%v chains=%d families=%v, want %v %d %v", told, chains, fams, tc.told, tc.chains, tc.families)
			}
		})
	}
}
