package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
)

// restartGap is how long TestAgentFollowsKubeProxy keeps kube-proxy away: longer than several
// detections (agent.FollowPoll), shorter than agent.FollowSettle.
const restartGap = 5 * time.Second

// TestAgentFollowsKubeProxy (#40): the real kube-proxy is restarted from iptables to nftables mode
// while the agent runs with `proxyMode: auto` and `backend: auto`. The agent follows it without a
// restart: kube-proxy away for restartGap, its rules removed, is not taken for "no kube-proxy";
// nnm_agent_info says nftables from kube-proxy's /proxyMode, invalid-drop moves to the
// nftables backend and its iptables chains go once it is in (make before break, the takeover's path),
// a ProxyModeChanged Event is posted on the Node, and Service traffic through kube-proxy still works.
// Sampled every 100 ms from before kube-proxy stops until the iptables chains are gone, invalid-drop
// is never missing from both backends (longest gap 0 samples). The IPVS → nftables restart, where
// ipvs-externalip-dnat must go, needs IP_VS: the VM lane (e2e/vm, TestGuestKubeProxyIPVS/follow/ipvs-to-nftables).
func TestAgentFollowsKubeProxy(t *testing.T) {
	require(t)
	kubeproxytest.Require(t)
	c := sharedCluster(t, "kube-proxy")
	n := startKubeProxyNode(t, c, "iptables")
	a := n.startAgent()
	pid := a.PID()
	m := a.MetricsT(t)
	info := m.Find("nnm_agent_info")
	if len(info) != 1 || info[0].Labels["proxy_mode"] != "iptables" || info[0].Labels["backend"] != "iptables" {
		t.Fatalf("before: nnm_agent_info = %v, want iptables mode and backend", info)
	}
	variant := info[0].Labels["iptables_variant"]
	ipt := &node{t: t, c: c, ns: n.ns, backend: "iptables", variant: variant}
	nft := &node{t: t, c: c, ns: n.ns, backend: "nftables", variant: variant}
	fams := []string{"ipv4", "ipv6"}
	agenttest.Eventually(t, converge, func() error {
		var errs []error
		for _, f := range fams {
			errs = append(errs, ipt.fixPresent(fixDrop, f))
		}
		return errors.Join(errs...)
	})

	gaps := map[string]*gap{"ipv4": {}, "ipv6": {}}
	stop := sampleEvery(100*time.Millisecond, func() {
		for _, f := range fams {
			e1, e2 := ipt.fixPresent(fixDrop, f), nft.fixPresent(fixDrop, f)
			gaps[f].sample(e1 == nil || e2 == nil, fmt.Sprintf("%v / %v", e1, e2))
		}
	})

	restart := time.Now()
	n.kp.Stop(10 * time.Second)
	// kube-proxy's rules go and it stays away for a while, as when its DaemonSet replaces its Pod
	// with one in another mode, which removes the old mode's rules before it answers: the agent sees
	// no kube-proxy for several detections and must not follow that (agent.FollowSettle).
	if err := n.kp.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(restartGap)
	opts := n.kpOpts
	opts.Mode = "nftables"
	n.kp = kubeproxytest.StartT(t, opts)
	n.kp.WaitModeT(t, 60*time.Second)
	answered := time.Since(restart)
	var followed time.Duration
	took := agenttest.Eventually(t, 60*time.Second, func() error {
		m, err := a.Metrics(t.Context())
		if err != nil {
			return err
		}
		info := m.Find("nnm_agent_info")
		if len(info) != 1 || info[0].Labels["proxy_mode"] != "nftables" || info[0].Labels["proxy_mode_source"] != "metrics-endpoint" || info[0].Labels["backend"] != "nftables" {
			return fmt.Errorf("nnm_agent_info = %v, want nftables from the metrics-endpoint with the nftables backend", info)
		}
		if followed == 0 {
			followed = time.Since(restart)
		}
		var errs []error
		for _, f := range fams {
			errs = append(errs, nft.fixPresent(fixDrop, f), ipt.fixAbsent(fixDrop, f))
		}
		return errors.Join(errs...)
	})
	stop()
	t.Logf("kube-proxy iptables → nftables: /proxyMode answered nftables %v after the stop, the agent followed by %v, iptables chains gone %v after the stop",
		answered.Round(10*time.Millisecond), followed.Round(10*time.Millisecond), (answered + took).Round(10*time.Millisecond))
	for _, f := range fams {
		g := gaps[f]
		t.Logf("invalid-drop (%s) through the switch: %d samples at 100 ms, %d without it in either backend, longest gap %d samples", f, g.samples, g.missing, g.longest)
		if g.longest > 0 {
			t.Errorf("invalid-drop (%s) missing from both backends for %d samples; first: %s", f, g.longest, g.first)
		}
	}
	if err := a.Exited(); err != nil || a.PID() != pid {
		t.Fatalf("the agent restarted or exited (pid %d → %d): %v", pid, a.PID(), err)
	}
	if l := agenttest.Lines(a.Logs(), "kube-proxy mode changed; following it"); len(l) != 1 {
		t.Errorf("want one log line of the change, got %q", l)
	} else {
		t.Logf("logged: %s", l[0])
	}
	if l := agenttest.Lines(a.Logs(), "kube-proxy mode may have changed"); len(l) == 0 || !strings.Contains(l[0], "seen=none") {
		t.Errorf("kube-proxy was away for %v: want the agent to log that it saw none and waited, got %q", restartGap, l)
	}
	agenttest.Eventually(t, converge, func() error {
		for _, e := range nodeEvents(t, c, n.name) {
			if e.Reason == "ProxyModeChanged" && strings.Contains(e.Note, "iptables → nftables") && strings.Contains(e.Note, "from iptables to nftables") {
				return nil
			}
		}
		return fmt.Errorf("no ProxyModeChanged Event naming iptables → nftables and the backend switch: %v", summary(nodeEvents(t, c, n.name)))
	})
	if got, err := n.traffic(); err != nil {
		t.Errorf("Service traffic through kube-proxy's nftables mode with the agent followed: %v", err)
	} else {
		t.Logf("after the switch: %v", got)
	}
	n.cleanupAgent(a)
}
