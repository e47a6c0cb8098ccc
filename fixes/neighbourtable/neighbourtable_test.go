package neighbourtable

import (
	"context"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// Desired raises at raiseAt of gc_thresh3 and on refused neighbours, keeps the kernel's 1:4:8,
// never lowers a threshold, stops at maxThresh3.
func TestDesired(t *testing.T) {
	s, err := parse(spec.Default())
	if err != nil {
		t.Fatal(err)
	}
	def := [3]int{128, 512, 1024}
	for name, c := range map[string]struct {
		o       Observation
		want    [3]int
		limited bool
		why     string
	}{
		"500 entries":         {Observation{Entries: 500, Thresh: def}, def, false, ""},
		"820 entries":         {Observation{Entries: 820, Thresh: def}, [3]int{256, 1024, 2048}, false, "820 entries, 80% of gc_thresh3 1024"},
		"overflowed":          {Observation{Entries: 1024, Thresh: def, Fulls: 976}, [3]int{256, 1024, 2048}, false, "refused 976 neighbours"},
		"5000 entries":        {Observation{Entries: 5000, Thresh: def}, [3]int{1280, 5120, 10240}, false, "5000 entries"},
		"OpenShift's values":  {Observation{Entries: 1000, Thresh: [3]int{8192, 32768, 65536}}, [3]int{8192, 32768, 65536}, false, ""},
		"gc_thresh1 higher":   {Observation{Entries: 900, Thresh: [3]int{1000, 512, 1024}}, [3]int{1000, 1024, 2048}, false, "900 entries"},
		"limited":             {Observation{Entries: 60000, Thresh: [3]int{8192, 32768, 65536}, Fulls: 3}, [3]int{8192, 32768, 65536}, true, "refused 3"},
		"lowered behind back": {Observation{Entries: 10, Thresh: def, Floor: [3]int{256, 1024, 2048}}, [3]int{256, 1024, 2048}, false, ""},
	} {
		d := Desired(c.o, s)
		if d.Thresh != c.want || d.Limited != c.limited || !strings.Contains(d.Why, c.why) || (c.why == "" && d.Why != "") {
			t.Errorf("%s: %+v, want %v limited %v why %q", name, d, c.want, c.limited, c.why)
		}
	}
}

func TestParseStats(t *testing.T) {
	text := `entries  allocs   destroys hash_grows lookups  hits     res_failed rcv_probes_mcast rcv_probes_ucast periodic_gc_runs forced_gc_runs unresolved_discards table_fulls
00000400 000000af 000000e2 00000000   0000024e 0000003d 00000000   00000000         00000000         000000fd         00000010       00000000            000001e8
00000400 000000ec 000000b7 00000003   000002b7 0000006b 00000000   00000000         00000000         00000000         00000004       00000000            000001e8
`
	e, fulls, err := ParseStats(text)
	if err != nil || e != 1024 || fulls != 976 {
		t.Errorf("ParseStats: %d entries, %d fulls, %v; want 1024, 976", e, fulls, err)
	}
	if _, _, err := ParseStats("entries allocs\n1 2 3\n"); err == nil {
		t.Error("a line that does not match the header parsed")
	}
}

// Ensure raises both families through the sysctls and Revert restores them.
func TestEnsureAndRevert(t *testing.T) {
	sys := nodestate.NewFakeSysctl(map[string]string{})
	for _, fam := range rules.Families {
		for i, v := range []string{"128", "512", "1024"} {
			sys.Values[Thresh(fam, i+1)] = v
		}
	}
	f, err := New(fix.Params{Sysctl: sys})
	if err != nil {
		t.Fatal(err)
	}
	entries := map[rules.Family]int{rules.IPv4: 100, rules.IPv6: 10}
	fulls := map[rules.Family]uint64{}
	f.stats = func(fam rules.Family) (int, uint64, error) { return entries[fam], fulls[fam], nil }
	if err := f.Configure(map[string]any{"stateDir": t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if res, err := f.Ensure(ctx, testkit.Snapshot(), true); err != nil || res.Changed || sys.Writes != 0 || res.Covered != 2 {
		t.Fatalf("a quiet node: %+v %v, %d writes", res, err, sys.Writes)
	}
	entries[rules.IPv4], fulls[rules.IPv4] = 1024, 500
	if res, err := f.Ensure(ctx, testkit.Snapshot(), true); err != nil || !res.Changed {
		t.Fatalf("an overflowed IPv4 table: %+v %v", res, err)
	}
	if got := []string{sys.Values[Thresh(rules.IPv4, 1)], sys.Values[Thresh(rules.IPv4, 2)], sys.Values[Thresh(rules.IPv4, 3)], sys.Values[Thresh(rules.IPv6, 3)]}; strings.Join(got, ",") != "256,1024,2048,1024" {
		t.Errorf("thresholds: %v", got)
	}
	if err := f.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if sys.Values[Thresh(rules.IPv4, 3)] != "1024" || sys.Values[Thresh(rules.IPv4, 1)] != "128" {
		t.Errorf("after Revert: %v", sys.Values)
	}
}

func TestConfigErrors(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	for key, val := range map[string]any{"raiseAt": 0, "targetFill": 0.95, "maxThresh3": 100, "stateDir": "x"} {
		e.ConfigureFails(testkit.Snapshot(), map[string]any{key: val}, key)
	}
}
