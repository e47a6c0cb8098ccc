package dataplane

// The connection-reset reproduction (reset_test.go) with a real kube-proxy in the node namespace
// (bin/kube-proxy, v1.36.3, against the shared control plane). Which lane proves what:
//   - reset_test.go: the problem and the fix on a bare node, both families and backends;
//   - this file: the same beside kube-proxy. In nftables mode kube-proxy installs no INVALID drop at
//     all, so the reset happens with kube-proxy alone and the agent prevents it. In iptables mode
//     kube-proxy drops INVALID packets in KUBE-FORWARD only; the crafted segment is not de-NATed and
//     is addressed to the node itself (INPUT), so the reset happens with kube-proxy alone too, and our
//     INPUT drop, next to kube-proxy's FORWARD drop, prevents it;
//   - e2e/vm: the same in kube-proxy's IPVS mode on kernel 6.1 (the VM lane), when it runs there.

import (
	"fmt"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/kubeproxytest"
)

// withKubeProxy starts kube-proxy in mode in the topology's node namespace (Node named name, its
// InternalIP the masquerade address) and waits until it serves and has synced.
func withKubeProxy(t *testing.T, tp *resetTopo, mode, name string) *kubeproxytest.Proxy {
	t.Helper()
	kubeproxytest.Require(t)
	cp := controlPlane(t)
	kc, err := cp.ConnectNamespace(tp.node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubeproxytest.CreateNode(t.Context(), cp.AdminClient(), name, resetV4.nodeExt.String()); err != nil {
		t.Fatal(err)
	}
	kp := kubeproxytest.StartT(t, kubeproxytest.Options{Netns: tp.node.Name, Kubeconfig: kc, Mode: mode, NodeName: name, ClusterCIDR: "10.244.0.0/16"})
	kp.WaitModeT(t, 60*time.Second)
	return kp
}

// kubeProxyInvalidDrop returns kube-proxy's own INVALID drop rules in the node namespace.
func kubeProxyInvalidDrop(t *testing.T, tp *resetTopo, mode string) []string {
	t.Helper()
	if mode == "nftables" {
		out := tp.node.MustExec("nft", "list", "table", "ip", "kube-proxy")
		return agenttest.Lines(out, "ct state invalid", "drop")
	}
	return agenttest.Lines(tp.node.MustExec("iptables-save", "-t", "filter"), "-A KUBE-FORWARD", "INVALID", "-j DROP")
}

func TestConnectionResetBesideKubeProxy(t *testing.T) {
	require(t, "nft", "conntrack", "sysctl", "iptables-save")
	p := resetV4
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			reproduced := t.Run("kube-proxy-alone", func(t *testing.T) {
				tp := newResetTopo(t)
				withKubeProxy(t, tp, mode, "reset-"+mode)
				drops := kubeProxyInvalidDrop(t, tp, mode)
				t.Logf("kube-proxy %s mode, its INVALID drop rules: %q", mode, drops)
				if (mode == "iptables") != (len(drops) == 1) {
					t.Fatalf("kube-proxy %s mode: INVALID drop rules %q; want one in KUBE-FORWARD in iptables mode, none in nftables mode", mode, drops)
				}
				in := inject(t, tp, p, true)
				t.Logf("kube-proxy %s mode alone: %s", mode, in)
				if in.invalidExt != 1 || in.rstSent != 1 || len(in.rstSeen) != 1 || !isReset(in.serverErr) {
					t.Fatalf("want the reset reproduced beside kube-proxy %s mode: %s", mode, in)
				}
			})
			if !reproduced {
				t.Fatal("the problem did not reproduce beside kube-proxy alone, so the runs with the agent would prove nothing")
			}
			for _, be := range backends {
				t.Run("with-agent/"+be, func(t *testing.T) {
					tp := newResetTopo(t)
					withKubeProxy(t, tp, mode, fmt.Sprintf("reset-%s-%s", mode, be))
					agent := agenttest.StartT(t, agenttest.Options{Netns: tp.node.Name, Args: []string{
						"--backend", be, "--proxy-mode", "auto", "--disable-fix", "ipvs-externalip-dnat", "--log-level", "debug",
					}})
					agent.WaitReadyT(t, 20*time.Second)
					if info := agent.MetricsT(t).Find("nnm_agent_info", "proxy_mode", mode); len(info) != 1 {
						t.Fatalf("nnm_agent_info should name kube-proxy's %s mode: %v", mode, agent.MetricsT(t).Find("nnm_agent_info"))
					}
					drops := kubeProxyInvalidDrop(t, tp, mode)
					in := inject(t, tp, p, false)
					t.Logf("kube-proxy %s mode + agent (%s): %s; kube-proxy's INVALID drops still there: %q", mode, be, in, drops)
					if in.invalidExt != 1 {
						t.Errorf("the crafted segment was not INVALID (observe counter +%d): the run proves nothing", in.invalidExt)
					}
					if in.rstSent != 0 || len(in.rstSeen) != 0 || in.serverErr != nil {
						t.Fatalf("beside kube-proxy %s mode with the agent: %s", mode, in)
					}
					if (mode == "iptables") != (len(drops) == 1) {
						t.Fatalf("kube-proxy's own INVALID drop changed with the agent running: %q", drops)
					}
					if _, err := in.client.Write([]byte("after\n")); err != nil {
						t.Fatal(err)
					}
					select {
					case c := <-in.serverRx:
						if c.err != nil || c.data != "after\n" {
							t.Fatalf("server got %q, %v", c.data, c.err)
						}
					case <-time.After(3 * time.Second):
						t.Fatal("pod → server data did not arrive")
					}
					v, _ := agent.MetricsT(t).Value("nnm_invalid_drop_dropped_packets_total", "family", p.family)
					t.Logf("kube-proxy %s mode + agent (%s): data flows; nnm_invalid_drop_dropped_packets_total = %v", mode, be, v)
					if v < 1 {
						t.Errorf("nnm_invalid_drop_dropped_packets_total = %v, want ≥ 1", v)
					}
					if mode == "iptables" && be == "iptables" {
						filter := tp.node.MustExec("iptables-save", "-t", "filter")
						t.Logf("kube-proxy's and our INVALID drops side by side: %q", agenttest.Lines(filter, "INVALID", "DROP"))
					}
				})
			}
		})
	}
}
