package ipvsexternalipdnat

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
)

// FuzzNoRefusedEntry: whatever a Service's ingress and externalIPs say (any text, any bytes), no map
// entry is ever made for an address that is never DNATed (special-purpose, cloud metadata and the
// IPv6 forms that carry them, IPv4-mapped, this node's pod CIDRs and addresses, the Service CIDRs,
// another Service's Cluster-IP outside them), nor outside allowedCIDRs, in either family; every
// entry comes from an input written exactly as that address.
func FuzzNoRefusedEntry(f *testing.F) {
	for _, seed := range [][3]string{
		{"169.254.169.254", "127.0.0.1", "203.0.113.10"},
		{"::ffff:127.0.0.1", "::ffff:203.0.113.10", "0.0.0.0"},
		{"fe80::1", "ff02::1", "2001:db8:e::1"},
		{"10.244.1.7", "192.168.10.5", "2001:db8:a::5"},
		{"100.64.0.1", "::", "255.255.255.255"},
		{" 203.0.113.11", "0203.0.113.12", "::7f00:1"},
		{"100.100.100.200", "64:ff9b::a9fe:a9fe", "10.96.0.1"},
		{"198.18.0.10", "2002:a9fe:a9fe::", "fd00:ec2::254"},
	} {
		f.Add(seed[0], seed[1], seed[2], false)
		f.Add(seed[0], seed[1], seed[2], true)
	}
	f.Fuzz(func(t *testing.T, a, b, c string, narrow bool) {
		opts := map[string]any{"specExternalIPs": true}
		allowed := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
		if narrow {
			opts = map[string]any{"allowedCIDRs": "203.0.113.0/25,2001:db8:e::/64,100.64.0.0/10", "specExternalIPs": true}
			allowed = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("2001:db8:e::/64"), netip.MustParsePrefix("100.64.0.0/10")}
		}
		fx := tk.NewFixEnv(t, New, opts).Fix
		snap := tk.Snapshot(tk.WithNode(nodeWithAddresses), tk.WithServiceCIDRs("10.96.0.0/16", "fd00:10:96::/112"), tk.WithServices(
			tk.Service("default", "fuzz", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer(a, b), tk.ExternalIPs(c), tk.Ports(tk.TCP(80))),
			tk.Service("default", "other", tk.ClusterIPs("198.18.0.10", "2001:2::10"), tk.Ports(tk.TCP(80)))))
		ins := []string{a, b, c}
		for _, fam := range rules.Families {
			rs, _, err := fx.Rules(snap, fam)
			if err != nil {
				t.Fatalf("Rules(%s): %v", fam, err)
			}
			for _, e := range rs.Map(MapName).Entries {
				if _, refused := rules.NeverDNAT(e.Addr); refused {
					t.Errorf("%s: entry for the never-DNAT address %s (inputs %q)", fam, e.Addr, ins)
				}
				for _, p := range append(slices.Clone(inputs.PodCIDRs.Get(snap)), inputs.ServiceCIDRs.Get(snap)...) {
					if p.Contains(e.Addr) {
						t.Errorf("%s: entry for %s in the pod CIDR %s", fam, e.Addr, p)
					}
				}
				for _, na := range []string{"192.168.10.5", "2001:db8:a::5", "198.18.0.10", "2001:2::10"} {
					if e.Addr == netip.MustParseAddr(na) {
						t.Errorf("%s: entry for the node address %s", fam, na)
					}
				}
				in := false
				for _, p := range allowed {
					in = in || p.Contains(e.Addr)
				}
				if !in {
					t.Errorf("%s: entry for %s outside allowedCIDRs", fam, e.Addr)
				}
				from := false
				for _, s := range ins {
					if x, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && x == e.Addr {
						from = true
					}
				}
				if !from {
					t.Errorf("%s: entry for %s comes from no input written as that address (inputs %q)", fam, e.Addr, ins)
				}
			}
		}
	})
}
