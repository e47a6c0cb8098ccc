package app

import (
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestPlanHelperProcess is the child of TestPlanCreatesNothing: `plan` with every setting on auto,
// so that detection probes everything it can, run entirely inside the test's network namespace.
func TestPlanHelperProcess(t *testing.T) {
	netns.Child(t, "TestPlanCreatesNothing")
	if _, err := runCmd(t, "plan", "--services", examples+"services.yaml"); err != nil {
		t.Fatal(err)
	}
}

// TestPlanCreatesNothing (#23): `plan` is meant to touch nothing. Run in a fresh network namespace,
// it used to leave empty legacy mangle tables behind (detection ran `iptables-legacy-save -t mangle`,
// which creates the table), after which iptables-nft warns "iptables-legacy tables present". The
// legacy and nftables rulesets, and the kernel's list of legacy tables, are the same before and after.
func TestPlanCreatesNothing(t *testing.T) {
	netns.Require(t, "nft", "iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft")
	ns := netns.New(t, "nnm-plan")
	snapshot := func() map[string]string {
		out := map[string]string{}
		for name, cmd := range map[string][]string{
			"iptables-legacy-save":       {"iptables-legacy-save"},
			"ip6tables-legacy-save":      {"ip6tables-legacy-save"},
			"nft list ruleset":           {"nft", "list", "ruleset"},
			"/proc/net/ip_tables_names":  {"cat", "/proc/net/ip_tables_names"},
			"/proc/net/ip6_tables_names": {"cat", "/proc/net/ip6_tables_names"},
		} {
			got, err := ns.Exec(cmd...)
			if err != nil {
				got = "error: " + err.Error() // a names file is absent until a table exists
			}
			out[name] = got
		}
		return out
	}
	before := snapshot()
	if out, errOut, err := ns.RunChild("TestPlanHelperProcess"); err != nil {
		t.Fatalf("plan in %s: %v\n%s%s", ns.Name, err, out, errOut)
	}
	after := snapshot()
	for name, b := range before {
		if after[name] != b {
			t.Errorf("%s changed by plan:\nbefore: %q\nafter:  %q", name, b, after[name])
		}
	}
	if w, _ := ns.Exec("iptables-nft-save"); len(w) > 0 {
		t.Logf("iptables-nft-save after plan: %q", w)
	}
}
