package conntrackcapacity

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

const gib = 1 << 30

func defaults(t *testing.T) Settings {
	t.Helper()
	s, err := parse(spec.Default())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Desired raises on fill and on lost connections, to a multiple of Granule, never lowers, stops at
// the memory bound (but not below what kube-proxy sets), and keeps the buckets at a quarter.
func TestDesired(t *testing.T) {
	s := defaults(t)
	// 4 CPUs: kube-proxy's default sets 131072; 8 GiB × 5 % / 384 B = 1,118,481 entries.
	base := Observation{Max: 131072, Buckets: 32768, MemoryBytes: 8 * gib, CPUs: 4}
	for name, c := range map[string]struct {
		o            func(o *Observation)
		max, buckets int
		limited      bool
		why          string
	}{
		"half full":         {func(o *Observation) { o.Entries = 65536 }, 131072, 32768, false, ""},
		"75% full":          {func(o *Observation) { o.Entries = 98304 }, 196608, 49152, false, "the table is 75% full (98304 of 131072)"},
		"full":              {func(o *Observation) { o.Entries = 131072 }, 262144, 65536, false, "the table is 100% full"},
		"drops, half full":  {func(o *Observation) { o.Entries = 60000; o.Lost = 12 }, 262144, 65536, false, "12 connections lost"},
		"at the bound":      {func(o *Observation) { o.Entries = 131072; o.MemoryBytes = gib / 2 }, 131072, 32768, true, "the table is 100% full"},
		"bound above":       {func(o *Observation) { o.Entries = 131072; o.MemoryBytes = 3 * gib / 2 }, 209715, 52428, true, "100% full"},
		"memory unknown":    {func(o *Observation) { o.Entries = 131072; o.MemoryBytes = 0 }, 131072, 32768, true, "100% full"},
		"set higher by ops": {func(o *Observation) { o.Max, o.Entries = 2000000, 10 }, 2000000, 32768, false, ""},
		"lowered behind":    {func(o *Observation) { o.Max, o.Floor = 65536, 262144 }, 262144, 65536, false, ""},
		"buckets higher":    {func(o *Observation) { o.Entries, o.Buckets = 131072, 1<<20 }, 262144, 1 << 20, false, "100% full"},
	} {
		o := base
		c.o(&o)
		d := Desired(o, s)
		if d.Max != c.max || d.Buckets != c.buckets || d.Limited != c.limited || !strings.Contains(d.Why, c.why) || (c.why == "" && d.Why != "") {
			t.Errorf("%s: %+v, want max %d buckets %d limited %v why %q", name, d, c.max, c.buckets, c.limited, c.why)
		}
		if d.Max < o.Max || d.Buckets < o.Buckets {
			t.Errorf("%s: lowered: %+v from %+v", name, d, o)
		}
	}
	if got := KubeProxyMax(32768, 131072, 64); got != KubeProxyLimit {
		t.Errorf("kube-proxy on 64 CPUs: %d, want its cap %d", got, KubeProxyLimit)
	}
	if got := KubeProxyMax(0, 131072, 4); got != 0 {
		t.Errorf("kube-proxy with maxPerCore 0 sets %d, want nothing", got)
	}
}

type fakeStats struct{ s *nodestate.ConntrackStats }

func (f fakeStats) Stats(context.Context) (nodestate.ConntrackStats, error) { return *f.s, nil }

// Ensure raises through the sysctls, remembers what it found, repairs a value lowered behind its
// back, and Revert restores the found values only where its own still stand.
func TestEnsureAndRevert(t *testing.T) {
	dir := t.TempDir()
	sys := nodestate.NewFakeSysctl(map[string]string{Count: "1000", Max: "131072", Buckets: "32768"})
	stats := &nodestate.ConntrackStats{}
	f, err := New(fix.Params{Sysctl: sys})
	if err != nil {
		t.Fatal(err)
	}
	f.stats, f.host = fakeStats{stats}, func() (uint64, int, error) { return 8 * gib, 4, nil }
	if err := f.Configure(map[string]any{"stateDir": dir}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ensure := func(want string) fix.Result {
		t.Helper()
		res, err := f.Ensure(ctx, testkit.Snapshot(), true)
		if err != nil {
			t.Fatal(err)
		}
		if got := sys.Values[Max]; got != want {
			t.Fatalf("nf_conntrack_max %s, want %s", got, want)
		}
		return res
	}
	if res := ensure("131072"); res.Changed || sys.Writes != 0 {
		t.Errorf("a table at 1%% changed: %+v, %d writes", res, sys.Writes)
	}
	stats.Drop = 40 // the first pass saw 0: 40 lost since
	if res := ensure("262144"); !res.Changed || sys.Values[Buckets] != "65536" {
		t.Errorf("40 drops: %+v, buckets %s", res, sys.Values[Buckets])
	}
	if b, err := os.ReadFile(filepath.Join(dir, StateFile)); err != nil || !strings.Contains(string(b), `"previous": "131072"`) {
		t.Errorf("state file: %s %v", b, err)
	}
	if res := ensure("262144"); res.Changed {
		t.Errorf("no new drop, a change: %+v", res)
	}
	sys.Values[Max] = "131072" // someone lowered it
	if res := ensure("262144"); !res.Repaired {
		t.Errorf("lowered behind its back: %+v, want a repair", res)
	}
	if err := f.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if sys.Values[Max] != "131072" || sys.Values[Buckets] != "32768" {
		t.Errorf("after Revert: %v", sys.Values)
	}
	// Raised again; an operator then sets their own value: Revert leaves it.
	stats.Drop = 80
	ensure("262144")
	sys.Values[Max] = "500000"
	if err := f.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if sys.Values[Max] != "500000" || sys.Values[Buckets] != "32768" {
		t.Errorf("Revert over an operator's value: %v", sys.Values)
	}
}

func TestConfigErrors(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	for key, val := range map[string]any{"raiseAt": 1.5, "targetFill": 0.9, "maxMemoryPercent": 0, "kubeProxyMin": -1, "stateDir": "run"} {
		e.ConfigureFails(testkit.Snapshot(), map[string]any{key: val}, key)
	}
}
