package mssclamp

// Test address plan: this node's pod CIDRs are 10.244.1.0/24 and fd00:10:244:1::/64 (a second IPv4
// range 10.245.1.0/24 where a node has two); the pod interface prefix is "cali".

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

type env struct {
	fix *Fix
	be  *testkit.FakeBackend
	reg *prometheus.Registry
}

func newEnv(t *testing.T, options map[string]any) *env {
	t.Helper()
	e := &env{be: testkit.NewFakeBackend(), reg: prometheus.NewRegistry()}
	f, err := New(Params{Backend: e.be, Registry: e.reg})
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

var dualStack = testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))))

// rulesAndApply returns the formatted rules and skips of both families after checking that the fake
// backend takes them.
func (e *env) rulesAndApply(t *testing.T, snap *fix.Snapshot) string {
	t.Helper()
	var out []string
	for _, fam := range rules.Families {
		rs, rep, err := e.fix.Rules(snap, fam)
		if err != nil {
			t.Fatalf("Rules(%s): %v", fam, err)
		}
		if rs != nil {
			if err := testkit.Apply(context.Background(), e.be, rs); err != nil {
				t.Fatalf("fake backend rejected the %s rules: %v\n%s", fam, err, testkit.Format(rs))
			}
		}
		s := testkit.Format(rs)
		for _, sk := range rep.Skipped {
			s += "skipped " + sk.Object + ": " + sk.Reason + " (" + sk.Detail + ")\n"
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n")
}

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
			e := newEnv(t, tc.options)
			got := e.rulesAndApply(t, tc.snap)
			testkit.Golden(t, "testdata/"+tc.name+".golden", got)
			if again := e.rulesAndApply(t, tc.snap); again != got {
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
		e := newEnv(t, map[string]any{"mss": 1400})
		before := e.rulesAndApply(t, dualStack)
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
		if after := e.rulesAndApply(t, dualStack); after != before {
			t.Errorf("a rejected Configure(%v) changed the rules", tc.options)
		}
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if e.fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q) = true, want off by default", mode)
		}
	}
	if e.fix.Needs() != (fix.Needs{Node: true}) {
		t.Errorf("Needs = %+v, want the Node", e.fix.Needs())
	}
	if !rules.ValidFixID(e.fix.ID()) || e.fix.Description() == "" {
		t.Error("bad id or description")
	}
}

func TestSynMetric(t *testing.T) {
	e := newEnv(t, nil)
	want := func(v4, v6 string) {
		t.Helper()
		exp := "# HELP nnm_mss_clamp_syn_packets_total Forwarded TCP SYN and SYN-ACK segments of pod traffic that went through the MSS clamp (their MSS is lowered only where it exceeded the limit).\n" +
			"# TYPE nnm_mss_clamp_syn_packets_total counter\n"
		if v4 != "" {
			exp += `nnm_mss_clamp_syn_packets_total{family="ipv4"} ` + v4 + "\n"
		}
		if v6 != "" {
			exp += `nnm_mss_clamp_syn_packets_total{family="ipv6"} ` + v6 + "\n"
		}
		if err := testutil.GatherAndCompare(e.reg, strings.NewReader(exp), "nnm_mss_clamp_syn_packets_total"); err != nil {
			t.Error(err)
		}
	}
	want("", "")
	e.rulesAndApply(t, dualStack)
	set := func(fam rules.Family, name string, packets uint64) {
		t.Helper()
		if err := e.be.SetCounter(ID, fam, name, backend.Counter{Packets: packets}); err != nil {
			t.Fatal(err)
		}
	}
	set(rules.IPv4, CounterFromPods, 3)
	set(rules.IPv4, CounterToPods, 2)
	set(rules.IPv6, CounterToPods, 4)
	want("5", "4")
	// A rewrite resets the kernel counters; the export does not go down.
	e.rulesAndApply(t, dualStack)
	want("5", "4")
	set(rules.IPv4, CounterFromPods, 1)
	want("6", "4")
	testkit.Promlint(t, e.reg)
}

// TestREADMEDump checks that the README's rule dump is what the fix produces (the central
// fixes.TestFixes checks sections, example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	e := newEnv(t, nil)
	rs, _, _ := e.fix.Rules(dualStack, rules.IPv4)
	r.Contains(t, "the rule dump", strings.SplitN(testkit.Format(rs), "\n", 2)[1])
}
