package main

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
)

// layout is how the External-IPs lie: consecutive addresses (a few /24s fill up) or one /24 each.
type layout string

const (
	consecutive layout = "consecutive"
	scattered   layout = "scattered"
)

func (p plan) extIP(l layout, i int) netip.Addr {
	if l == scattered {
		return p.scattered(i)
	}
	return p.consecutive(i)
}

// ruleset is the ipvs-externalip-dnat fix's own ruleset for n LoadBalancer Services of family p
// (svc-i: Cluster-IP p.clusterIP(i), ingress IP p.extIP(l, i), TCP port 80), computed by the fix
// itself (its Rules), so the benchmark loads what the agent would.
func ruleset(p plan, l layout, n int) (*rules.Ruleset, error) {
	svcs := make([]*corev1.Service, n)
	for i := range n {
		// Spread over namespaces: the fix takes at most fix.MaxEntriesPerNamespace entries from one.
		svcs[i] = tk.Service(fmt.Sprintf("bench-%d", i/(fix.MaxEntriesPerNamespace/2)), fmt.Sprintf("svc-%05d", i), tk.ClusterIPs(p.clusterIP(i).String()),
			tk.LoadBalancer(p.extIP(l, i).String()), tk.Ports(tk.TCP(80)))
	}
	snap := tk.Snapshot(tk.WithServices(svcs...),
		tk.WithPodCIDRs(plans[rules.IPv4].podCIDR.String(), plans[rules.IPv6].podCIDR.String()),
		tk.WithServiceCIDRs(plans[rules.IPv4].serviceCIDR.String(), plans[rules.IPv6].serviceCIDR.String()))
	f, err := ipvsexternalipdnat.New(fix.Params{Registry: prometheus.NewRegistry()})
	if err != nil {
		return nil, err
	}
	rs, _, err := f.Rules(snap, p.family)
	if err != nil {
		return nil, err
	}
	if got := len(rs.Map(ipvsexternalipdnat.MapName).Entries); got != n {
		return nil, fmt.Errorf("the fix made %d entries of %d Services", got, n)
	}
	return rs, nil
}

// newBackend is the real backend of that name, to be used on a thread inside the node namespace
// (netns.Do): its processes and netlink sockets live there.
func newBackend(name string) (backend.Backend, error) {
	switch name {
	case "iptables":
		return iptables.New(iptables.Options{Variant: iptables.NFT, Logger: quiet})
	case "nftables":
		return nftables.New(nftables.Options{Logger: quiet})
	}
	return nil, fmt.Errorf("backend %q: want iptables or nftables", name)
}

// load makes the node hold rs (nil: nothing of the fix) with backend name, from a fresh backend (as
// an agent's first sync).
func (l *lab) load(ctx context.Context, name string, family rules.Family, rs *rules.Ruleset) error {
	return netns.Do(netns.Path(l.node[0]), func() error {
		b, err := newBackend(name)
		if err != nil {
			return err
		}
		_, err = b.Reconcile(ctx, ipvsexternalipdnat.ID, family, rs, backend.Verify)
		return err
	})
}

// kernelRules counts the node's nat rules of family (iptables-nft-save), and the nft objects'
// lines (nft list ruleset): what the smoke test checks a load by.
func (l *lab) kernelRules(ctx context.Context, family rules.Family) (string, error) {
	save := "iptables-nft-save"
	if family == rules.IPv6 {
		save = "ip6tables-nft-save"
	}
	ipt, err := netns.Exec(ctx, l.node[0], save, "-t", "nat")
	if err != nil {
		return "", err
	}
	nft, err := netns.Exec(ctx, l.node[0], "nft", "list", "ruleset")
	return ipt + nft, err
}

func runHost(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	return string(out), err
}
