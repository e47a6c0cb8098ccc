package invaliddrop

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/sysctl"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// Test address plan: exempt sources come from the documentation prefixes 192.0.2.0/24,
// 198.51.100.0/24 and 2001:db8:1::/48. The fix reads no Services or Nodes.

type env struct {
	fix  *Fix
	be   *testkit.FakeBackend
	reg  *prometheus.Registry
	sys  *sysctl.Fake
	logs *bytes.Buffer
}

func newEnv(t *testing.T, options map[string]any) *env {
	t.Helper()
	e := &env{be: testkit.NewFakeBackend(), reg: prometheus.NewRegistry(), sys: sysctl.NewFake(nil), logs: &bytes.Buffer{}}
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, err := New(Params{Backend: e.be, Registry: e.reg, Sysctl: e.sys, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if options != nil {
		if err := f.Configure(options); err != nil {
			t.Fatalf("Configure(%v): %v", options, err)
		}
	}
	e.fix = f
	return e
}

// rulesAndApply returns the formatted rules of both families after checking the fake backend takes them.
func (e *env) rulesAndApply(t *testing.T) string {
	t.Helper()
	var out []string
	for _, fam := range rules.Families {
		rs, _, err := e.fix.Rules(testkit.Snapshot(), fam)
		if err != nil {
			t.Fatalf("Rules(%s): %v", fam, err)
		}
		if err := testkit.Apply(context.Background(), e.be, rs); err != nil {
			t.Fatalf("fake backend rejected the %s rules: %v\n%s", fam, err, testkit.Format(rs))
		}
		out = append(out, testkit.Format(rs))
	}
	return strings.Join(out, "\n")
}

func TestRules(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
	}{
		{"default", nil},
		{"forward-only", map[string]any{"hooks": []any{"forward"}}},
		{"both-hooks-protocols", map[string]any{"hooks": []any{"forward", "INPUT"}, "protocols": []any{"udp", "tcp", "sctp", "tcp"}}},
		{"exemptions", map[string]any{
			"exemptSourceCIDRs": []any{"198.51.100.7", "192.0.2.0/24", "2001:db8:1::/48"},
			"protocols":         "tcp",
		}},
		{"exemptions-ipv4-only", map[string]any{"hooks": "input,forward", "exempt-source-cidrs": "192.0.2.0/24"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.options)
			testkit.Golden(t, "testdata/"+tc.name+".golden", e.rulesAndApply(t))
		})
	}
}

func TestRulesDeterministic(t *testing.T) {
	e := newEnv(t, map[string]any{"hooks": []any{"forward", "input"}, "protocols": []any{"udp", "tcp"}})
	a, b := e.rulesAndApply(t), e.rulesAndApply(t)
	if a != b {
		t.Fatalf("Rules is not deterministic:\n%s\n---\n%s", a, b)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		options map[string]any
		want    []string // every string must appear in the error
	}{
		{map[string]any{"chains": []any{"input"}}, []string{"chains"}},
		{map[string]any{"hooks": []any{"prerouting"}}, []string{"fixes.invalid-drop.hooks", `"prerouting"`}},
		{map[string]any{"hooks": []any{"inptu"}}, []string{"hooks", `"inptu"`}},
		{map[string]any{"hooks": []any{}}, []string{"hooks", "at least one"}},
		{map[string]any{"protocols": []any{"icmp"}}, []string{"protocols", `"icmp"`}},
		{map[string]any{"exemptSourceCIDRs": []any{"10.0.0.0/33"}}, []string{"exemptSourceCIDRs", `"10.0.0.0/33"`}},
		{map[string]any{"exemptSourceCIDRs": []any{"10.0.0.1/8"}}, []string{"exemptSourceCIDRs", "did you mean 10.0.0.0/8"}},
		{map[string]any{"hooks": map[string]any{"a": 1}}, []string{"hooks"}},
	}
	for _, tc := range cases {
		e := newEnv(t, map[string]any{"hooks": []any{"forward"}})
		before := e.rulesAndApply(t)
		err := e.fix.Configure(tc.options)
		if err == nil {
			t.Errorf("Configure(%v) accepted", tc.options)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Configure(%v) = %q, want it to mention %s", tc.options, err, w)
			}
		}
		if after := e.rulesAndApply(t); after != before {
			t.Errorf("a rejected Configure(%v) changed the rules", tc.options)
		}
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if !e.fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q) = false", mode)
		}
	}
	if e.fix.Needs() != (fix.Needs{}) {
		t.Errorf("Needs = %+v, want nothing", e.fix.Needs())
	}
	if e.fix.ID() != "invalid-drop" || !rules.ValidFixID(e.fix.ID()) || e.fix.Description() == "" {
		t.Error("bad id or description")
	}
}

func TestDroppedMetric(t *testing.T) {
	e := newEnv(t, map[string]any{"hooks": "input,forward", "protocols": "tcp,udp"})
	ctx := context.Background()
	want := func(v4, v6 string) {
		t.Helper()
		exp := "# HELP nnm_invalid_drop_dropped_packets_total Packets dropped because conntrack marked them INVALID, summed over hooks and protocols.\n" +
			"# TYPE nnm_invalid_drop_dropped_packets_total counter\n"
		if v4 != "" {
			exp += `nnm_invalid_drop_dropped_packets_total{family="ipv4"} ` + v4 + "\n"
		}
		if v6 != "" {
			exp += `nnm_invalid_drop_dropped_packets_total{family="ipv6"} ` + v6 + "\n"
		}
		if err := testutil.GatherAndCompare(e.reg, strings.NewReader(exp), "nnm_invalid_drop_dropped_packets_total"); err != nil {
			t.Error(err)
		}
	}
	// Nothing applied: the backend has no counters, nothing is exported.
	want("", "")

	rs, _, _ := e.fix.Rules(testkit.Snapshot(), rules.IPv4)
	if err := testkit.Apply(ctx, e.be, rs); err != nil {
		t.Fatal(err)
	}
	set := func(name string, packets uint64) {
		t.Helper()
		if err := e.be.SetCounter(ID, rules.IPv4, name, backend.Counter{Packets: packets, Bytes: packets * 60}); err != nil {
			t.Fatal(err)
		}
	}
	set("dropped-input-tcp", 5)
	set("dropped-forward-udp", 2)
	want("7", "")
	set("dropped-input-tcp", 8)
	want("10", "")
	// A rewrite of the chains resets the kernel counters: the export must not go down.
	if err := testkit.Apply(ctx, e.be, rs); err != nil {
		t.Fatal(err)
	}
	want("10", "")
	set("dropped-input-tcp", 1)
	want("11", "")
	// A failed read keeps the last total instead of dropping the series.
	e.be.SetCountersError(context.DeadlineExceeded)
	want("11", "")
	e.be.SetCountersError(nil)

	// IPv6 joins once it is applied.
	rs6, _, _ := e.fix.Rules(testkit.Snapshot(), rules.IPv6)
	if err := testkit.Apply(ctx, e.be, rs6); err != nil {
		t.Fatal(err)
	}
	if err := e.be.SetCounter(ID, rules.IPv6, "dropped-input-udp", backend.Counter{Packets: 3}); err != nil {
		t.Fatal(err)
	}
	want("11", "3")
}

func TestRedundantMetricAndLog(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	gauge := func() float64 { return testutil.ToFloat64(e.fix.m.redundant) }

	// Sysctl missing: not redundant, debug log only.
	e.fix.Observe(ctx, rules.IPv4, fix.Report{})
	if gauge() != 0 || !strings.Contains(e.logs.String(), "level=DEBUG") || strings.Contains(e.logs.String(), "level=INFO") {
		t.Fatalf("missing sysctl: gauge=%v logs=%s", gauge(), e.logs)
	}
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "1"
	for range 3 {
		e.fix.Observe(ctx, rules.IPv4, fix.Report{})
		e.fix.Observe(ctx, rules.IPv6, fix.Report{})
	}
	if gauge() != 1 {
		t.Errorf("be_liberal=1: gauge=%v", gauge())
	}
	if n := strings.Count(e.logs.String(), "redundant"); n != 1 {
		t.Errorf("redundancy logged %d times, want once:\n%s", n, e.logs)
	}
	if !strings.Contains(e.logs.String(), "fix=invalid-drop") {
		t.Errorf("log lacks fix=invalid-drop: %s", e.logs)
	}
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "0"
	e.fix.Observe(ctx, rules.IPv4, fix.Report{})
	if gauge() != 0 {
		t.Errorf("be_liberal=0: gauge=%v", gauge())
	}
}

func TestMetricsLint(t *testing.T) {
	e := newEnv(t, nil)
	rs, _, _ := e.fix.Rules(testkit.Snapshot(), rules.IPv4)
	if err := testkit.Apply(context.Background(), e.be, rs); err != nil {
		t.Fatal(err)
	}
	testkit.Promlint(t, e.reg)
	if n, err := testutil.GatherAndCount(e.reg); err != nil || n != 2 {
		t.Errorf("gathered %d series (%v), want 2 (dropped ipv4, redundant)", n, err)
	}
}

// TestREADMEDump checks that the README's rule dump is what the fix produces for the configuration
// it describes (the central fixes.TestFixes checks sections, example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	e := newEnv(t, map[string]any{"hooks": "input,forward", "protocols": "tcp", "exemptSourceCIDRs": "192.0.2.0/24"})
	rs, _, _ := e.fix.Rules(testkit.Snapshot(), rules.IPv4)
	r.Contains(t, "the rule dump", strings.SplitN(testkit.Format(rs), "\n", 2)[1])
}
