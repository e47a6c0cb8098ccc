package e2e

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// TestSecondAgentLeavesTheFirstAlone (#41 rows 5 and 9): a second agent started by hand with the
// defaults beside a running one (same network namespace, same API server and Node) used to remove
// the running agent's External-IP DNAT at its start (21 s without it), and two nftables agents with
// the same config rewrote each other's objects endlessly (24 repairs per agent per minute). Now the
// second agent finds the node lock held: it exits with an error naming the holder and programs
// nothing. Sampled every 100 ms from before its start until 5 s after it ended, the first agent's
// DNAT entries and both fixes' chains are never missing, and the first agent repairs nothing; a
// second agent with exactly the first one's flags is refused the same way.
func TestSecondAgentLeavesTheFirstAlone(t *testing.T) {
	eachBackend(t, func(t *testing.T, c *cluster, be string) {
		n := startNode(t, c, be, nodeOptions{})
		svcs := newServices(t, c, "lock-"+be)
		svc := svcs.create(lbService("", "web"))
		svcs.setIngress("web", "203.0.41.10")
		wantEntry := want(svc, "203.0.41.10", "tcp", 80)
		n.expectEntries(converge, wantEntry)
		repairsBefore := n.metrics().Sum("nnm_sync_repairs_total")

		// Sample the first agent's rules every 100 ms until told to stop.
		var g gap
		stop := sampleEvery(100*time.Millisecond, func() {
			err := errors.Join(n.fixPresent(fixExtIP, "ipv4"), n.fixPresent(fixDrop, "ipv4"))
			if got, derr := n.dnatEntries("ipv4"); err == nil && (derr != nil || !slices.Contains(got, wantEntry)) {
				err = fmt.Errorf("DNAT entry %s missing: %q %v", wantEntry, got, derr)
			}
			g.sample(err == nil, fmt.Sprint(err))
		})

		kubeconfig := n.args[slices.Index(n.args, "--kubeconfig")+1]
		for i, args := range [][]string{
			// By hand, with the defaults: backend and proxy mode auto, no config file.
			{"--kubeconfig", kubeconfig, "--node-name", n.name},
			// Exactly the first agent's flags (but its own metrics port).
			slices.Clone(n.args),
		} {
			second, err := agenttest.Start(agenttest.Options{Netns: n.ns.Name, Args: args, MetricsPort: 9490 + i})
			if err != nil {
				t.Fatal(err)
			}
			ended := agenttest.Poll(t.Context(), 20*time.Second, 100*time.Millisecond, func() error {
				if second.Exited() == nil {
					return fmt.Errorf("the second agent still runs")
				}
				return nil
			})
			logs := second.Logs()
			if ended != nil {
				_ = second.Kill()
				t.Errorf("%s, second agent %d: it ran for 20 s beside the first (want it refused at start); its log:\n%s", be, i, second.LogTail(30))
				continue
			}
			holder := fmt.Sprintf("pid %d", n.agent.PID())
			if !strings.Contains(logs, "another agent programs this node's network namespace") || !strings.Contains(logs, holder) {
				t.Errorf("%s, second agent %d: its log does not say that %s holds the node; log:\n%s", be, i, holder, second.LogTail(30))
			}
		}
		time.Sleep(5 * time.Second)
		stop()
		repairs := n.metrics().Sum("nnm_sync_repairs_total") - repairsBefore
		t.Logf("%s: %d samples at 100 ms, %d without the first agent's rules (longest run %d); the first agent's repairs meanwhile: %v",
			be, g.samples, g.missing, g.longest, repairs)
		if g.missing > 0 {
			t.Errorf("%s: the first agent's rules were missing in %d of %d samples (longest %d); first: %s", be, g.missing, g.samples, g.longest, g.first)
		}
		if repairs > 0 {
			t.Errorf("%s: the first agent repaired %v times while the second ran", be, repairs)
		}
		n.expectEntries(converge, wantEntry)
	})
}
