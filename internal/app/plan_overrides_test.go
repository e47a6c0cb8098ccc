package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/fixes"
)

// `plan` resolves nodeOverrides against the labels of the file's Node, as the agent does on that
// node, names the entry that applies and prints the rules of what it enables.
func TestPlanShowsTheNodeOverride(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config := write("config.yaml", `fixes:
  invalid-drop: {enabled: false}
  ipvs-externalip-dnat: {enabled: false}
  conntrack-liberal: {enabled: false}
nodeOverrides:
- nodeSelector: {matchLabels: {pool: general}}
  fixes: {invalid-drop: {enabled: false}}
- nodeSelector:
    matchExpressions: [{key: pool, operator: In, values: [canary, edge]}]
  fixes:
    mss-clamp: {enabled: true, mss: 1400}
`)
	for _, tc := range []struct{ pool, want, notWant string }{
		{"canary", "# nodeOverrides: override 1 (pool in (canary,edge)) applies on node node-1\n", "# fix mss-clamp: disabled"},
		{"batch", "# nodeOverrides: none of 2 applies on node node-1: the base configuration\n", "fix mss-clamp, family"},
	} {
		services := write("services-"+tc.pool+".yaml", "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-1\n  labels: {pool: "+tc.pool+"}\nspec:\n  podCIDRs: [10.244.1.0/24]\n")
		cmd := New(Build{Version: "test"}, fixes.Standard)
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"plan", "--config", config, "--services", services, "--proxy-mode", "ipvs", "--backend", "nftables"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%s: %v", tc.pool, err)
		}
		if !strings.Contains(out.String(), tc.want) || strings.Contains(out.String(), tc.notWant) {
			t.Errorf("pool %s: plan lacks %q or has %q:\n%s", tc.pool, tc.want, tc.notWant, out.String())
		}
		if tc.pool == "canary" && !strings.Contains(out.String(), "1400") {
			t.Errorf("the entry's mss option is not in the plan:\n%s", out.String())
		}
	}
}
