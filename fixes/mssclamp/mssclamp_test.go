package mssclamp

// Test address plan: this node's pod CIDRs are 10.244.1.0/24 and fd00:10:244:1::/64 (a second IPv4
// range 10.245.1.0/24 where a node has two); the pod interface prefix is "cali".

import (
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

var dualStack = testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))))

func TestRules(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		snap    *fix.Snapshot
	}{
		{"default", nil, dualStack},
		{"fixed-mss", map[string]any{"mss": 1360}, dualStack},
		{"two-ipv4-ranges-no-ipv6", nil, testkit.Snapshot(testkit.WithPodCIDRs("10.244.1.0/24", "10.245.1.0/24"))},
		{"no-pod-cidr", nil, testkit.Snapshot()},
		{"interface-prefix", map[string]any{"podInterfacePrefix": "cali", "mss": "1300"}, testkit.Snapshot()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := testkit.NewFixEnv(t, New, tc.options)
			got := e.Dump(tc.snap)
			testkit.Golden(t, "testdata/"+tc.name+".golden", got)
			if again := e.Dump(tc.snap); again != got {
				t.Fatalf("Rules is not deterministic:\n%s\n---\n%s", got, again)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		options map[string]any
		want    []string // every string must appear in the error
	}{
		{map[string]any{"clampTo": 1300}, []string{"clampTo"}},
		{map[string]any{"mss": 100}, []string{"fixes.mss-clamp.mss", "100", "536"}},
		{map[string]any{"mss": 70000}, []string{"fixes.mss-clamp.mss", "70000"}},
		{map[string]any{"mss": -1}, []string{"fixes.mss-clamp.mss"}},
		{map[string]any{"mss": "pmtu"}, []string{"mss"}},
		{map[string]any{"podInterfacePrefix": "veth 0"}, []string{"fixes.mss-clamp.podInterfacePrefix", `"veth 0"`}},
		{map[string]any{"podInterfacePrefix": "a-very-long-interface"}, []string{"fixes.mss-clamp.podInterfacePrefix"}},
	}
	for _, tc := range cases {
		testkit.NewFixEnv(t, New, map[string]any{"mss": 1400}).ConfigureFails(dualStack, tc.options, tc.want...)
	}
}

func TestStatic(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if e.Fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q) = true, want off by default", mode)
		}
	}
	if got := testkit.Reads(e.Fix); got != "PodCIDRs" {
		t.Errorf("Reads = %s, want the pod CIDRs", got)
	}
	if !rules.ValidFixID(e.Fix.ID()) || e.Fix.Description() == "" {
		t.Error("bad id or description")
	}
}

func TestSynMetric(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	want := func(series ...string) {
		t.Helper()
		if got := e.Metric("nnm_mss_clamp_syn_packets_total"); got != strings.Join(series, "\n") {
			t.Errorf("nnm_mss_clamp_syn_packets_total:\n%s\nwant:\n%s", got, strings.Join(series, "\n"))
		}
	}
	want()
	e.Dump(dualStack)
	e.SetCounter(rules.IPv4, CounterFromPods, 3)
	e.SetCounter(rules.IPv4, CounterToPods, 2)
	e.SetCounter(rules.IPv6, CounterToPods, 4)
	want(`{family="ipv4"} 5`, `{family="ipv6"} 4`)
	// A rewrite resets the kernel counters; the export does not go down.
	e.Dump(dualStack)
	want(`{family="ipv4"} 5`, `{family="ipv6"} 4`)
	e.SetCounter(rules.IPv4, CounterFromPods, 1)
	want(`{family="ipv4"} 6`, `{family="ipv6"} 4`)
	testkit.Promlint(t, e.Registry)
}

// TestREADMEDump checks that the README's rule dump is what the fix produces (the central
// fixes.TestFixes checks sections, example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	rs, _ := testkit.NewFixEnv(t, New, nil).Sync(dualStack, rules.IPv4)
	r.Contains(t, "the rule dump", strings.SplitN(testkit.Format(rs), "\n", 2)[1])
}
