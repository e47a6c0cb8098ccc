package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// The predecessor's leftovers as a migrating node has them: NMANAGER_ chains in filter and nat with
// jumps from the built-in chains, beside kube-proxy's chains that must stay untouched.
var predecessorSetup = [][]string{
	{"-t", "filter", "-N", "NMANAGER_DROP_INVALID_INPUT"},
	{"-t", "filter", "-A", "NMANAGER_DROP_INVALID_INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
	{"-t", "filter", "-I", "INPUT", "-j", "NMANAGER_DROP_INVALID_INPUT"},
	{"-t", "nat", "-N", "NMANAGER_PREROUTING"},
	{"-t", "nat", "-N", "NMANAGER_EX_CLUS_IP"},
	{"-t", "nat", "-A", "NMANAGER_PREROUTING", "-j", "NMANAGER_EX_CLUS_IP"},
	{"-t", "nat", "-I", "PREROUTING", "-j", "NMANAGER_PREROUTING"},
	{"-t", "filter", "-N", "KUBE-FIREWALL"},
	{"-t", "filter", "-A", "KUBE-FIREWALL", "-m", "mark", "--mark", "0x8000/0x8000", "-j", "DROP"},
	{"-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"},
	{"-t", "nat", "-N", "KUBE-SERVICES"},
	{"-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"},
}

func save(t *testing.T, ns *netns.NS, bin string) string {
	t.Helper()
	out := ns.MustOutput(bin + "-save")
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "#") { // timestamps
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// agentApp is the agent's core with invalid-drop on the iptables backend (variant) in ns, watching
// an empty list of objects, with no host probes (the values are configured), cleaning up the
// predecessor as the agent does and running the engine; env adds to the agent's settings, extra to
// the app.
func agentApp(t *testing.T, ns *netns.NS, variant iptables.Variant, env []string, extra ...fx.Option) *fxtest.App {
	t.Helper()
	return fxtest.New(t, append([]fx.Option{fx.NopLogger,
		invaliddrop.Module,
		agent.Module,
		fx.Supply(agent.Inputs{Environ: append([]string{"NNM_PROXY_MODE=ipvs", "NNM_BACKEND=iptables",
			"NNM_IPTABLES_VARIANT=" + string(variant), "NNM_METRICS_ADDRESS=", "NNM_LOG_LEVEL=error"}, env...)}),
		fx.Supply(&detect.Probes{}),
		fx.Provide(func() (backend.Backend, error) {
			return iptables.New(iptables.Options{Variant: variant, Runner: ns})
		}),
		fx.Provide(watch.Offline),
		fx.Invoke(agent.CleanPredecessor),
		fx.Invoke(func(lc fx.Lifecycle, en *engine.Engine) { lc.Append(fx.Hook{OnStart: en.Start, OnStop: en.Stop}) }),
	}, extra...)...)
}

func foreign(dump string) string {
	var keep []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.Contains(l, "KUBE-") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// When the agent takes over (its first fix synced), the predecessor's NMANAGER_ chains and the jumps
// to them go, in both families; our chains and foreign chains stay.
func TestPredecessorChainsRemovedOnTakeover(t *testing.T) {
	netns.Require(t, "iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy")
	for _, variant := range []iptables.Variant{iptables.NFT, iptables.Legacy} {
		t.Run(string(variant), func(t *testing.T) {
			ns := netns.New(t, "nnm-pred")
			bins := []string{"iptables-" + string(variant), "ip6tables-" + string(variant)}
			for _, bin := range bins {
				for _, args := range predecessorSetup {
					ns.MustExec(append([]string{bin}, args...)...)
				}
			}
			before := map[string]string{}
			for _, bin := range bins {
				before[bin] = save(t, ns, bin)
				if !strings.Contains(before[bin], "NMANAGER_") {
					t.Fatalf("%s: setup did not create NMANAGER_ chains:\n%s", bin, before[bin])
				}
			}

			var e *engine.Engine
			app := agentApp(t, ns, variant, []string{"NNM_MIN_SYNC_PERIOD=0s"}, fx.Populate(&e))
			app.RequireStart()
			defer app.RequireStop()

			agenttest.Eventually(t, 15*time.Second, func() error {
				for _, bin := range bins {
					if out := save(t, ns, bin); strings.Contains(out, "NMANAGER_") {
						return fmt.Errorf("%s: NMANAGER_ chains still present:\n%s", bin, out)
					}
				}
				return nil
			})
			for _, bin := range bins {
				after := save(t, ns, bin)
				if !strings.Contains(after, ":NNM-INVALID-INPUT") || !strings.Contains(after, "-j NNM-INVALID-INPUT") {
					t.Errorf("%s: our invalid-drop chain or jump missing after takeover:\n%s", bin, after)
				}
				if foreign(after) != foreign(before[bin]) {
					t.Errorf("%s: foreign rules changed:\nbefore:\n%s\nafter:\n%s", bin, foreign(before[bin]), foreign(after))
				}
			}
		})
	}
}

// Without any enabled fix nothing is taken over, so nothing of the predecessor is removed.
func TestPredecessorKeptWithoutEnabledFix(t *testing.T) {
	netns.Require(t, "iptables-nft")
	ns := netns.New(t, "nnm-pred")
	for _, args := range predecessorSetup[:3] {
		ns.MustExec(append([]string{"iptables-nft"}, args...)...)
	}
	var takeover *agent.Takeover
	app := agentApp(t, ns, iptables.NFT, []string{"NNM_FIXES_INVALID_DROP_ENABLED=false", "NNM_FIXES_IPVS_EXTERNALIP_DNAT_ENABLED=false"},
		fx.Populate(&takeover))
	app.RequireStart()
	// A round of the clean-up, as the running one makes at every poll, done here so that the check
	// below follows it: with no fix enabled it removes nothing and keeps waiting.
	takeover.Round(t.Context())
	if !takeover.Pending() {
		t.Error("the clean-up ended although no fix runs")
	}
	app.RequireStop()
	if out := save(t, ns, "iptables-nft"); !strings.Contains(out, ":NMANAGER_DROP_INVALID_INPUT") {
		t.Errorf("predecessor chain removed although no fix runs:\n%s", out)
	}
}

// The other backend's leftovers (agent.Leftovers) are removed once per fix, and only after that fix
// synced (then the rest): at that moment our chains are already in the kernel, so a backend switch
// never leaves the node without the fix.
func TestLeftoversAfterFirstSync(t *testing.T) {
	netns.Require(t, "iptables-nft")
	ns := netns.New(t, "nnm-left")
	type call struct{ fix, kernel string }
	calls := make(chan call, 4)
	var takeover *agent.Takeover
	app := agentApp(t, ns, iptables.NFT, []string{"NNM_MIN_SYNC_PERIOD=0s", "NNM_FIXES_IPVS_EXTERNALIP_DNAT_ENABLED=false"},
		fx.Supply(agent.Leftovers(func(_ context.Context, fix string) (int, error) {
			calls <- call{fix, save(t, ns, "iptables-nft")}
			return 1, nil
		})), fx.Populate(&takeover))
	app.RequireStart()
	defer app.RequireStop()
	for _, fix := range []string{"invalid-drop", ""} {
		select {
		case c := <-calls:
			if c.fix != fix {
				t.Fatalf("leftovers removed for %q, want %q", c.fix, fix)
			}
			if !strings.Contains(c.kernel, "-j NNM-INVALID-INPUT") {
				t.Fatalf("the leftovers of %q were removed before our first sync; the kernel then held:\n%s", fix, c.kernel)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("the other backend's leftovers of %q were not removed within 15s of the start", fix)
		}
	}
	// Once the clean-up has no work left it never calls again: every call it made is in calls.
	agenttest.Until(t, 5*time.Second, func() bool { return !takeover.Pending() })
	if n := len(calls); n != 0 {
		t.Fatalf("the leftovers were removed %d more times; want once per fix and process", n)
	}
}
