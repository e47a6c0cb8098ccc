package metadatablock

import (
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// Test address plan: this node's pod CIDRs are 10.244.1.0/24 and fd00:10:244:1::/64; metadata
// addresses are 169.254.169.254 (AWS, GCP, Azure) and fd00:ec2::254 (AWS IPv6); exempt pods come
// from 10.244.1.128/25.

func dualStackNode() *fix.Snapshot {
	return testkit.Snapshot(testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))))
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
			testkit.Golden(t, "testdata/"+tc.name+".golden", testkit.NewFixEnv(t, New, tc.options).Dump(tc.snap))
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
		testkit.NewFixEnv(t, New, nil).ConfigureFails(dualStackNode(), tc.options, tc.want)
	}
}

func TestStatic(t *testing.T) {
	f := testkit.NewFixEnv(t, New, nil).Fix
	if f.DefaultEnabled(fix.Env{ProxyMode: "ipvs"}) || testkit.Reads(f) != "PodCIDRs" || !rules.ValidFixID(f.ID()) || f.Description() == "" {
		t.Error("bad default, needs, id or description")
	}
}

func TestDroppedMetric(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	e.Dump(dualStackNode())
	e.SetCounter(rules.IPv4, CounterName(mustAddr("169.254.169.254")), 4)
	if got, want := e.Metric("nnm_metadata_block_dropped_packets_total"), `{family="ipv4"} 4`; got != want {
		t.Errorf("nnm_metadata_block_dropped_packets_total: %s, want %s", got, want)
	}
	testkit.Promlint(t, e.Registry)
}

// TestREADMEDump checks the README's rule dump (the central examples/fixes test checks sections,
// example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	rs, _ := testkit.NewFixEnv(t, New, map[string]any{"exemptSourceCIDRs": "10.244.1.128/25"}).Sync(dualStackNode(), rules.IPv4)
	r.Contains(t, "the rule dump", testkit.Format(rs))
}
