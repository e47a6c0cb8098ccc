package dataplane

// Connection reset by an INVALID reply (kubernetes#74839, #117924) and the invalid-drop fix, on a
// bare node: the reproduction, its topology and what it observes are internal/testing/resettest's.
// Without the agent the reset happens; with the agent (invalid-drop, iptables then nftables) the
// segment is dropped in INPUT, no RST leaves the node, the connection keeps working both ways, and
// nnm_invalid_drop_dropped_packets_total counts it.

import (
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

func TestConnectionResetIPv4(t *testing.T) { testConnectionReset(t, resettest.V4) }
func TestConnectionResetIPv6(t *testing.T) { testConnectionReset(t, resettest.V6) }

func testConnectionReset(t *testing.T, p resettest.Plan) {
	require(t, "nft", "conntrack", "sysctl")

	reproduced := t.Run("without-agent", func(t *testing.T) {
		in := resettest.Inject(t, resettest.New(t), p, true)
		t.Logf("without agent: %s", in)
		if err := in.Reproduced(); err != nil {
			t.Error(err)
		}
	})
	if !reproduced {
		t.Fatal("the problem did not reproduce without the agent, so the runs with the agent would prove nothing")
	}

	for _, be := range backends {
		t.Run("with-agent/"+be, func(t *testing.T) {
			tp := resettest.New(t)
			agent := agenttest.StartT(t, agenttest.Options{Netns: tp.Node.Name, Args: []string{
				"--backend", be, "--disable-fix", "ipvs-externalip-dnat", "--log-level", "debug",
			}})
			agent.WaitReadyT(t, 20*time.Second)
			in := resettest.Inject(t, tp, p, false)
			t.Logf("with agent (%s): %s", be, in)
			if err := in.Prevented(); err != nil {
				t.Fatal(err)
			}
			v, err := in.DropMetric(agent.MetricsT(t))
			t.Logf("with agent (%s): data both ways OK; nnm_invalid_drop_dropped_packets_total{family=%q} = %v", be, p.Family, v)
			if err != nil {
				t.Error(err)
			}
		})
	}
}
