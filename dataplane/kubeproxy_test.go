package dataplane

// The connection-reset reproduction (internal/testing/resettest) with a real kube-proxy in the node namespace
// (bin/kube-proxy, v1.37.2, dual-stack, against the shared control plane), both families in each
// topology. Which lane proves what:
//   - reset_test.go: the problem and the fix on a bare node, both families and backends;
//   - this file: the same beside kube-proxy. In nftables mode kube-proxy installs no INVALID drop at
//     all, so the reset happens with kube-proxy alone and the agent prevents it. In iptables mode
//     kube-proxy drops INVALID packets in KUBE-FORWARD only; the crafted segment is not de-NATed and
//     is addressed to the node itself (INPUT), so the reset happens with kube-proxy alone too, and our
//     INPUT drop, next to kube-proxy's FORWARD drop, prevents it;
//   - e2e/vm: the same beside kube-proxy's IPVS mode on kernel 6.1 (the VM lane).

import (
	"fmt"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// withKubeProxy starts kube-proxy in mode in the topology's node namespace (Node named name, its
// InternalIPs the masquerade addresses) and waits until it serves and has synced.
func withKubeProxy(t *testing.T, tp *resettest.Topo, mode, name string) *kubeproxytest.Proxy {
	t.Helper()
	kubeproxytest.Require(t)
	cp := controlPlane(t)
	kc, err := cp.ConnectNamespace(tp.Node.Name)
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, p := range resettest.Plans {
		ips = append(ips, p.NodeExt.String())
	}
	if err := kubeproxytest.CreateNode(t.Context(), cp.AdminClient(), name, ips...); err != nil {
		t.Fatal(err)
	}
	kp := kubeproxytest.StartT(t, kubeproxytest.Options{Netns: tp.Node.Name, Kubeconfig: kc, Mode: mode, NodeName: name})
	kp.WaitModeT(t, 60*time.Second)
	return kp
}

// kubeProxyInvalidDrops returns kube-proxy's own INVALID drop rules of p's family in the node
// namespace, once kube-proxy has programmed that family (it syncs the families one after the other).
func kubeProxyInvalidDrops(t *testing.T, tp *resettest.Topo, mode string, p resettest.Plan) []string {
	t.Helper()
	var drops []string
	err := agenttest.Poll(t.Context(), 30*time.Second, 200*time.Millisecond, func() error {
		if mode == "nftables" {
			out, err := tp.Node.Exec("nft", "list", "table", p.NftFamily(), "kube-proxy")
			drops = agenttest.Lines(out, "ct state invalid", "drop")
			return err
		}
		out := tp.Node.MustExec(p.IPTablesSave(), "-t", "filter")
		if len(agenttest.Lines(out, "-A KUBE-FORWARD")) == 0 {
			return fmt.Errorf("no KUBE-FORWARD rules in %s yet", p.IPTablesSave())
		}
		drops = agenttest.Lines(out, "-A KUBE-FORWARD", "INVALID", "-j DROP")
		return nil
	})
	if err != nil {
		t.Fatalf("kube-proxy %s mode, %s: %v", mode, p.Family, err)
	}
	return drops
}

// wantKubeProxyDrops fails unless kube-proxy has one INVALID drop (KUBE-FORWARD) in iptables mode and
// none in nftables mode.
func wantKubeProxyDrops(t *testing.T, mode string, p resettest.Plan, drops []string) {
	t.Helper()
	if (mode == "iptables") != (len(drops) == 1) {
		t.Fatalf("kube-proxy %s mode, %s: INVALID drop rules %q; want one in KUBE-FORWARD in iptables mode, none in nftables mode", mode, p.Family, drops)
	}
}

func TestConnectionResetBesideKubeProxy(t *testing.T) {
	t.Parallel() // mostly waits for kube-proxy's syncs; its namespaces and Node names are its own
	require(t, "nft", "conntrack", "sysctl", "iptables-save", "ip6tables-save")
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			reproduced := t.Run("kube-proxy-alone", func(t *testing.T) {
				tp := resettest.New(t)
				withKubeProxy(t, tp, mode, "reset-"+mode)
				for _, p := range resettest.Plans {
					drops := kubeProxyInvalidDrops(t, tp, mode, p)
					t.Logf("kube-proxy %s mode, %s: its INVALID drop rules: %q", mode, p.Family, drops)
					wantKubeProxyDrops(t, mode, p, drops)
					in := resettest.Inject(t, tp, p, true)
					t.Logf("kube-proxy %s mode alone: %s", mode, in)
					if err := in.Reproduced(); err != nil {
						t.Fatalf("want the reset reproduced beside kube-proxy %s mode: %v", mode, err)
					}
				}
			})
			if !reproduced {
				t.Fatal("the problem did not reproduce beside kube-proxy alone, so the runs with the agent would prove nothing")
			}
			for _, be := range backends {
				t.Run("with-agent/"+be, func(t *testing.T) {
					tp := resettest.New(t)
					withKubeProxy(t, tp, mode, fmt.Sprintf("reset-%s-%s", mode, be))
					agent := agenttest.StartT(t, agenttest.Options{Netns: tp.Node.Name, Args: []string{
						"--backend", be, "--proxy-mode", "auto", "--disable-fix", "ipvs-externalip-dnat", "--log-level", "debug",
					}})
					agent.WaitReadyT(t, 20*time.Second)
					if info := agent.MetricsT(t).Find("nnm_agent_info", "proxy_mode", mode); len(info) != 1 {
						t.Fatalf("nnm_agent_info should name kube-proxy's %s mode: %v", mode, agent.MetricsT(t).Find("nnm_agent_info"))
					}
					for _, p := range resettest.Plans {
						in := resettest.Inject(t, tp, p, false)
						drops := kubeProxyInvalidDrops(t, tp, mode, p)
						t.Logf("kube-proxy %s mode + agent (%s): %s; kube-proxy's INVALID drops still there: %q", mode, be, in, drops)
						if err := in.Prevented(); err != nil {
							t.Fatalf("beside kube-proxy %s mode with the agent: %v", mode, err)
						}
						wantKubeProxyDrops(t, mode, p, drops)
						v, err := in.DropMetric(agent.MetricsT(t))
						t.Logf("kube-proxy %s mode + agent (%s), %s: data flows both ways; nnm_invalid_drop_dropped_packets_total = %v", mode, be, p.Family, v)
						if err != nil {
							t.Error(err)
						}
						if mode == "iptables" && be == "iptables" {
							all := tp.Node.MustExec(p.IPTablesSave())
							t.Logf("%s: kube-proxy's (filter) and our (mangle) INVALID drops side by side: %q", p.Family, agenttest.Lines(all, "INVALID", "DROP"))
						}
					}
				})
			}
		})
	}
}
