package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// TestBlindWatchesAreKnown (issue #63 row 5): the real API server stopped for longer than
// watch.BlindAfter and started again, under the real agent. At main 3f85643 nothing said the agent
// was blind: after five restarts a Node label change reached the kernel 42-45 s later while /readyz
// said 200, and no metric or log line told. Now nnm_watch_silence_seconds grows while the watches
// cannot reach the API server, /readyz and nnm_agent_ready turn not ready once it passes
// BlindAfter (the body says why), the log says "blind" when it does and "hear the API server again"
// when every watch has heard again (the reflector's backoff included), and then the agent is ready
// again. Its own control plane: the others' tests keep theirs.
func TestBlindWatchesAreKnown(t *testing.T) {
	t.Parallel()
	c := sharedCluster(t, "blind")
	n := startNode(t, c, "nftables", nodeOptions{})
	if v, ok := n.metrics().Value("nnm_watch_silence_seconds", "resource", "services"); !ok || v != 0 {
		t.Fatalf("nnm_watch_silence_seconds{resource=services} = %v (exported %v), want 0 while the watch is open", v, ok)
	}

	if err := c.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = c.cp.StartAPIServer(context.Background())
		}
	})
	// Ready until the silence passes BlindAfter (the outage is logged at once, the blindness not).
	agenttest.Consistently(t, watch.BlindAfter-5*time.Second, func() error { return n.agent.Probe(t.Context(), "/readyz") })
	agenttest.Eventually(t, 15*time.Second, func() error {
		code, body, err := n.agent.Get(t.Context(), "/readyz")
		if err != nil || code == 200 || !strings.Contains(body, "have not heard from the API server") {
			return fmt.Errorf("/readyz %d %q %v, want it to say the watches do not hear the API server", code, body, err)
		}
		return nil
	})
	m := n.metrics()
	silence, _ := m.Value("nnm_watch_silence_seconds", "resource", "services")
	ready, _ := m.Value("nnm_agent_ready")
	t.Logf("not ready %v after the API server stopped; nnm_watch_silence_seconds{resource=services} %.1f, nnm_agent_ready %v",
		time.Since(stopped).Round(100*time.Millisecond), silence, ready)
	if silence <= watch.BlindAfter.Seconds() || ready != 0 {
		t.Errorf("nnm_watch_silence_seconds{resource=services} = %v, nnm_agent_ready = %v; want over %v and 0", silence, ready, watch.BlindAfter.Seconds())
	}
	agenttest.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(n.agent.Logs(), "blind: the watches do not hear the API server") {
			return fmt.Errorf("no log line says the agent is blind")
		}
		return nil
	})

	if err := c.cp.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	back := time.Now()
	// The reflectors retry with their backoff (up to 30-60 s after a long outage).
	agenttest.Eventually(t, 90*time.Second, func() error { return n.agent.Probe(t.Context(), "/readyz") })
	t.Logf("ready again %v after the API server was back (it was down %v)", time.Since(back).Round(100*time.Millisecond), back.Sub(stopped).Round(100*time.Millisecond))
	agenttest.Eventually(t, 5*time.Second, func() error { // the hub looks every second
		if !strings.Contains(n.agent.Logs(), "the watches hear the API server again") {
			return fmt.Errorf("no log line says the watches hear the API server again")
		}
		return nil
	})
	// After a list the silence grows from 0 again until the watch stream opens; a watch that fails
	// right after the list (the API server just restarted) waits for the reflector's backoff (15.6 s
	// of silence after /readyz was 200 in one run).
	agenttest.Eventually(t, time.Minute, func() error {
		if v, ok := n.metrics().Value("nnm_watch_silence_seconds", "resource", "services"); !ok || v != 0 {
			return fmt.Errorf("nnm_watch_silence_seconds{resource=services} = %v after the recovery, want 0 (its stream open)", v)
		}
		return nil
	})
}
