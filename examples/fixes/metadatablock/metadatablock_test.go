package metadatablock

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

// Test address plan: this node's pod CIDRs are 10.244.1.0/24 and fd00:10:244:1::/64; metadata
// addresses are 169.254.169.254 (AWS, GCP, Azure) and fd00:ec2::254 (AWS IPv6); exempt pods come
// from 10.244.1.128/25.

var ctx = context.Background()

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

func dualStackNode() *fix.Snapshot {
	return testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))))
}

// dump returns the rules of both families (and the skips) after checking the fake backend takes them.
func (e *env) dump(t *testing.T, snap *fix.Snapshot) string {
	t.Helper()
	var out []string
	for _, fam := range rules.Families {
		rs, rep, err := e.fix.Rules(snap, fam)
		if err != nil {
			t.Fatalf("Rules(%s): %v", fam, err)
		}
		for _, s := range rep.Skipped {
			out = append(out, "# "+string(fam)+" skipped "+s.Object+": "+s.Reason+" ("+s.Detail+")\n")
		}
		if rs == nil {
			out = append(out, "# "+string(fam)+": no rules\n")
			continue
		}
		if err := testkit.Apply(ctx, e.be, rs); err != nil {
			t.Fatalf("fake backend rejected the %s rules: %v\n%s", fam, err, testkit.Format(rs))
		}
		out = append(out, testkit.Format(rs))
	}
	return strings.Join(out, "")
}

func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options map[string]any
		snap    *fix.Snapshot
	}{
		{"default", nil, dualStackNode()},
		{"dual-stack", map[string]any{"addresses": "fd00:ec2::254,169.254.169.254"}, dualStackNode()},
		{"exempt", map[string]any{"exemptSourceCIDRs": []any{"10.244.1.128/25"}}, dualStackNode()},
		{"no-pod-cidr", map[string]any{"addresses": "169.254.169.254,fd00:ec2::254"},
			testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24"))))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testkit.Golden(t, "testdata/"+tc.name+".golden", newEnv(t, tc.options).dump(t, tc.snap))
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		options map[string]any
		want    string
	}{
		{map[string]any{"addresses": []any{}}, "at least one"},
		{map[string]any{"addresses": "169.254.169.254/32"}, `"169.254.169.254/32" is not an IP address`},
		{map[string]any{"exemptSourceCIDRs": "10.0.0.1/8"}, "fixes.metadata-block.exemptSourceCIDRs"},
		{map[string]any{"adresses": "1.2.3.4"}, "adresses"},
	} {
		e := newEnv(t, nil)
		before := e.dump(t, dualStackNode())
		if err := e.fix.Configure(tc.options); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Configure(%v) = %v, want an error containing %q", tc.options, err, tc.want)
		}
		if e.dump(t, dualStackNode()) != before {
			t.Errorf("a rejected Configure(%v) changed the rules", tc.options)
		}
	}
}

func TestStatic(t *testing.T) {
	f := newEnv(t, nil).fix
	if f.DefaultEnabled(fix.Env{ProxyMode: "ipvs"}) || f.Needs() != (fix.Needs{Node: true}) || !rules.ValidFixID(f.ID()) || f.Description() == "" {
		t.Error("bad default, needs, id or description")
	}
}

func TestDroppedMetric(t *testing.T) {
	e := newEnv(t, nil)
	e.dump(t, dualStackNode())
	if err := e.be.SetCounter(ID, rules.IPv4, CounterName(mustAddr("169.254.169.254")), backend.Counter{Packets: 4}); err != nil {
		t.Fatal(err)
	}
	exp := "# HELP nnm_metadata_block_dropped_packets_total Packets from this node's pods to a blocked metadata address, dropped.\n" +
		"# TYPE nnm_metadata_block_dropped_packets_total counter\n" +
		"nnm_metadata_block_dropped_packets_total{family=\"ipv4\"} 4\n"
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(exp)); err != nil {
		t.Error(err)
	}
	testkit.Promlint(t, e.reg)
}

// TestREADMEDump checks the README's rule dump (the central examples/fixes test checks sections,
// example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	rs, _, _ := newEnv(t, map[string]any{"exemptSourceCIDRs": "10.244.1.128/25"}).fix.Rules(dualStackNode(), rules.IPv4)
	r.Contains(t, "the rule dump", testkit.Format(rs))
}
