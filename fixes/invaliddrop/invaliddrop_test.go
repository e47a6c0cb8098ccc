package invaliddrop

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// Test address plan: exempt sources come from the documentation prefixes 192.0.2.0/24,
// 198.51.100.0/24 and 2001:db8:1::/48. The fix reads no Services or Nodes.

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
			testkit.Golden(t, "testdata/"+tc.name+".golden", testkit.NewFixEnv(t, New, tc.options).Dump(nil))
		})
	}
}

func TestRulesDeterministic(t *testing.T) {
	e := testkit.NewFixEnv(t, New, map[string]any{"hooks": []any{"forward", "input"}, "protocols": []any{"udp", "tcp"}})
	a, b := e.Dump(nil), e.Dump(nil)
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
		testkit.NewFixEnv(t, New, map[string]any{"hooks": []any{"forward"}}).ConfigureFails(nil, tc.options, tc.want...)
	}
}

func TestStatic(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if !e.Fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q) = false", mode)
		}
	}
	if got := testkit.Reads(e.Fix); got != "" {
		t.Errorf("Reads = %s, want nothing", got)
	}
	if e.Fix.ID() != "invalid-drop" || !rules.ValidFixID(e.Fix.ID()) || e.Fix.Description() == "" {
		t.Error("bad id or description")
	}
}

func TestDroppedMetric(t *testing.T) {
	e := testkit.NewFixEnv(t, New, map[string]any{"hooks": "input,forward", "protocols": "tcp,udp"})
	want := func(series ...string) {
		t.Helper()
		if got := e.Metric("nnm_invalid_drop_dropped_packets_total"); got != strings.Join(series, "\n") {
			t.Errorf("nnm_invalid_drop_dropped_packets_total:\n%s\nwant:\n%s", got, strings.Join(series, "\n"))
		}
	}
	// Nothing applied: the backend has no counters, nothing is exported.
	want()

	e.Sync(nil, rules.IPv4)
	e.SetCounter(rules.IPv4, "dropped-input-tcp", 5)
	e.SetCounter(rules.IPv4, "dropped-forward-udp", 2)
	want(`{family="ipv4"} 7`)
	e.SetCounter(rules.IPv4, "dropped-input-tcp", 8)
	want(`{family="ipv4"} 10`)
	// A rewrite of the chains resets the kernel counters: the export must not go down.
	e.Sync(nil, rules.IPv4)
	want(`{family="ipv4"} 10`)
	e.SetCounter(rules.IPv4, "dropped-input-tcp", 1)
	want(`{family="ipv4"} 11`)
	// A failed read keeps the last total instead of dropping the series.
	e.Backend.SetCountersError(context.DeadlineExceeded)
	want(`{family="ipv4"} 11`)
	e.Backend.SetCountersError(nil)

	// IPv6 joins once it is applied.
	e.Sync(nil, rules.IPv6)
	e.SetCounter(rules.IPv6, "dropped-input-udp", 3)
	want(`{family="ipv4"} 11`, `{family="ipv6"} 3`)
}

func TestRedundantMetricAndLog(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	ctx := context.Background()
	gauge := func() float64 { return testutil.ToFloat64(e.Fix.m.redundant) }

	// Sysctl missing: not redundant, debug log only.
	e.Fix.Observe(ctx, rules.IPv4, fix.Report{})
	if gauge() != 0 || !strings.Contains(e.Logs.String(), "level=DEBUG") || strings.Contains(e.Logs.String(), "level=INFO") {
		t.Fatalf("missing sysctl: gauge=%v logs=%s", gauge(), e.Logs)
	}
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "1"
	for range 3 {
		e.Fix.Observe(ctx, rules.IPv4, fix.Report{})
		e.Fix.Observe(ctx, rules.IPv6, fix.Report{})
	}
	if gauge() != 1 {
		t.Errorf("be_liberal=1: gauge=%v", gauge())
	}
	if n := strings.Count(e.Logs.String(), "redundant"); n != 1 {
		t.Errorf("redundancy logged %d times, want once:\n%s", n, e.Logs)
	}
	if !strings.Contains(e.Logs.String(), "fix=invalid-drop") {
		t.Errorf("log lacks fix=invalid-drop: %s", e.Logs)
	}
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "0"
	e.Fix.Observe(ctx, rules.IPv4, fix.Report{})
	if gauge() != 0 {
		t.Errorf("be_liberal=0: gauge=%v", gauge())
	}
}

func TestMetricsLint(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	e.Sync(nil, rules.IPv4)
	testkit.Promlint(t, e.Registry)
	if n, err := testutil.GatherAndCount(e.Registry); err != nil || n != 2 {
		t.Errorf("gathered %d series (%v), want 2 (dropped ipv4, redundant)", n, err)
	}
}

// TestREADMEDump checks that the README's rule dump is what the fix produces for the configuration
// it describes (the central fixes.TestFixes checks sections, example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	rs, _ := testkit.NewFixEnv(t, New, map[string]any{"hooks": "input,forward", "protocols": "tcp", "exemptSourceCIDRs": "192.0.2.0/24"}).Sync(nil, rules.IPv4)
	r.Contains(t, "the rule dump", strings.SplitN(testkit.Format(rs), "\n", 2)[1])
}
