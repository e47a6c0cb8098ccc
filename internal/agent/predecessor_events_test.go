package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

type countingCleaner map[rules.Family]int

func (c countingCleaner) CleanupPredecessor(_ context.Context, f rules.Family, _ func(string) bool) (int, error) {
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
			tk.clean(context.Background(), "", nil)
			if told != tc.told || chains != tc.chains || !slices.Equal(fams, tc.families) {
				t.Fatalf("told=%v chains=%d families=%v, want %v %d %v", told, chains, fams, tc.told, tc.chains, tc.families)
			}
		})
	}
}

// Make before break, fix by fix (#41 row 4): a fix's share of the other backend's objects and of the
// predecessor's chains goes when that fix has synced, not when the first fix has; the rest when
// every enabled fix has. Disabled and node-state fixes wait for nothing.
func TestTakeoverFixByFix(t *testing.T) {
	var statuses []engine.Status
	var leftovers []string
	var predecessor []string
	chains := []string{"NMANAGER_DROP_INVALID_INPUT", "NMANAGER_PREROUTING", "NMANAGER_EX_CLUS_IP"}
	tk := &takeover{families: []rules.Family{rules.IPv4}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		statuses: func() []engine.Status { return statuses },
		leftovers: func(_ context.Context, fix string) (int, error) {
			leftovers = append(leftovers, fix)
			return 0, nil
		},
		pc: cleanerFunc(func(match func(string) bool) {
			for _, c := range chains {
				if match == nil || match(c) {
					predecessor = append(predecessor, c)
				}
			}
		})}
	done := map[string]bool{}
	ok := time.Now()
	statuses = []engine.Status{
		{Fix: "conntrack-liberal", Enabled: true, NodeState: true},
		{Fix: "invalid-drop", Enabled: true, LastOK: ok},
		{Fix: "ipvs-externalip-dnat", Enabled: true},
		{Fix: "stale-udp-conntrack", Enabled: false},
	}
	if tk.step(context.Background(), done) {
		t.Fatal("step says done while ipvs-externalip-dnat has not synced")
	}
	if !slices.Equal(leftovers, []string{"invalid-drop"}) || !slices.Equal(predecessor, chains[:1]) {
		t.Fatalf("after invalid-drop synced: leftovers of %q, predecessor chains %q; want invalid-drop's only", leftovers, predecessor)
	}
	if tk.step(context.Background(), done) || len(leftovers) != 1 {
		t.Fatalf("a second step with nothing new synced removed more: %q", leftovers)
	}
	statuses[2].LastOK = ok
	if !tk.step(context.Background(), done) {
		t.Fatal("step not done after every enabled fix synced")
	}
	if want := []string{"invalid-drop", "ipvs-externalip-dnat", ""}; !slices.Equal(leftovers, want) {
		t.Fatalf("leftovers removed for %q, want %q", leftovers, want)
	}
	if want := append(append([]string{}, chains...), chains...); !slices.Equal(predecessor, want) {
		t.Fatalf("predecessor chains matched %q, want %q (each fix's, then all that are left)", predecessor, want)
	}
}

type cleanerFunc func(match func(string) bool)

func (f cleanerFunc) CleanupPredecessor(_ context.Context, _ rules.Family, match func(string) bool) (int, error) {
	f(match)
	return 0, nil
}

// A backend switch while running (#40) takes the same path: what the old backend holds of a fix goes
// only once the fix synced with the new backend (an earlier success with the old one does not
// count), the rest once every enabled fix has; and the job of the start stops removing what is now
// the backend in use.
func TestTakeoverSwitched(t *testing.T) {
	var statuses []engine.Status
	var startup, switched []string
	ok := time.Now()
	statuses = []engine.Status{
		{Fix: "invalid-drop", Enabled: true, LastOK: ok, Backend: "iptables"},
		{Fix: "ipvs-externalip-dnat", Enabled: true}, // waits: the start's job is not done
	}
	tk := &Takeover{wake: make(chan struct{}, 1), base: takeover{families: []rules.Family{rules.IPv4},
		log: slog.New(slog.DiscardHandler), statuses: func() []engine.Status { return statuses }}}
	first := tk.base
	first.leftovers = func(_ context.Context, fix string) (int, error) { startup = append(startup, fix); return 0, nil }
	tk.jobs = []*job{{t: &first, done: map[string]bool{}}}
	step := func() {
		tk.mu.Lock()
		defer tk.mu.Unlock()
		var left []*job
		for _, j := range tk.jobs {
			if !j.t.step(context.Background(), j.done) {
				left = append(left, j)
			}
		}
		tk.jobs = left
	}
	step()
	if !slices.Equal(startup, []string{"invalid-drop"}) {
		t.Fatalf("start: leftovers removed for %q", startup)
	}
	tk.Switched(func(_ context.Context, fix string) (int, error) { switched = append(switched, fix); return 0, nil }, "nftables")
	step()
	if len(switched) != 0 {
		t.Fatalf("leftovers of %q removed before any fix synced with the new backend", switched)
	}
	statuses[0].LastOK, statuses[0].Backend = ok.Add(time.Second), "nftables"
	statuses[1].LastOK, statuses[1].Backend = ok, "iptables"
	step()
	if !slices.Equal(switched, []string{"invalid-drop"}) {
		t.Fatalf("after invalid-drop synced with nftables: removed %q, want invalid-drop's only", switched)
	}
	statuses[1].Backend = "nftables"
	step()
	if want := []string{"invalid-drop", "ipvs-externalip-dnat", ""}; !slices.Equal(switched, want) {
		t.Fatalf("removed %q, want %q", switched, want)
	}
	if !slices.Equal(startup, []string{"invalid-drop"}) {
		t.Fatalf("the start's job removed %q after the switch; its other backend is the one in use now", startup)
	}
	if tk.Pending() {
		t.Fatal("jobs left after every fix synced")
	}
}
