package ipvsexternalipdnat

// Test address plan (all tests in this file):
//
//	node            node-a
//	pod CIDRs       10.244.1.0/24, fd00:10:244:1::/64      (node.spec.podCIDRs)
//	Cluster-IPs     10.96.0.0/16,  fd00:10:96::/112        (spec.clusterIPs; the Service CIDRs where a
//	                                                        test sets them)
//	External-IPs    203.0.113.0/24, 2001:db8:e::/48        (RFC 5737 / RFC 3849 documentation prefixes)
//	                .10-.19 LoadBalancer ingress, .20-.29 spec.externalIPs, .30-.39 skipped on purpose
//	Services        namespace "default" unless the test is about ordering ("a", "b")

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
)

var nodeA = tk.Node("node-a", tk.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))

// nodeWithAddresses is node-a with status.addresses 192.168.10.5 and 2001:db8:a::5 (and a hostname,
// which is no address).
var nodeWithAddresses = tk.Node("node-a", tk.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"), func(n *corev1.Node) {
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.168.10.5"},
		{Type: corev1.NodeExternalIP, Address: "2001:db8:a::5"},
		{Type: corev1.NodeHostName, Address: "node-a"},
	}
})

func TestRules(t *testing.T) {
	cases := []struct {
		name    string
		options map[string]any
		snap    *fix.Snapshot
	}{
		{"ipv4", nil, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.ETPLocal(),
				tk.Ports(tk.Named("http", tk.TCP(80)), tk.Named("https", tk.TCP(443)))),
		))},
		{"ipv6", nil, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "web6", tk.ClusterIPs("fd00:10:96::10"), tk.LoadBalancer("2001:db8:e::10"), tk.ETPLocal(),
				tk.Ports(tk.Named("http", tk.TCP(80)))),
		))},
		{"dual-stack-protocols", nil, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "dns", tk.ClusterIPs("fd00:10:96::53", "10.96.0.53"),
				tk.LoadBalancer("203.0.113.11", "2001:db8:e::11", "203.0.113.12"),
				tk.Ports(tk.Named("dns-udp", tk.UDP(53)), tk.Named("dns-tcp", tk.TCP(53)), tk.SCTP(9))),
			// No protocol set means TCP, as in the API defaults.
			tk.Service("default", "noproto", tk.ClusterIPs("10.96.0.54", "fd00:10:96::54"), tk.LoadBalancer("203.0.113.13"),
				tk.Ports(tk.PortSpec{Port: 8080})),
		))},
		{"external-ips", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "cip", tk.ClusterIPType(), tk.ClusterIPs("10.96.0.20"), tk.ExternalIPs("203.0.113.20", "2001:db8:e::20"),
				tk.Ports(tk.TCP(80))),
			tk.Service("default", "np", tk.NodePortType(), tk.ClusterIPs("10.96.0.21", "fd00:10:96::21"), tk.ExternalIPs("203.0.113.21", "2001:db8:e::21"),
				tk.Ports(tk.UDP(5000))),
			// The same address in the ingress and in externalIPs is one address.
			tk.Service("default", "lb", tk.ClusterIPs("10.96.0.22"), tk.LoadBalancer("203.0.113.22"), tk.ExternalIPs("203.0.113.22", "::ffff:203.0.113.23"),
				tk.Ports(tk.TCP(80))),
		))},
		{"skips", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "proxy-mode", tk.ClusterIPs("10.96.0.30"), tk.IngressProxyMode("203.0.113.30"), tk.LoadBalancer("203.0.113.31"),
				tk.IngressVIPMode("203.0.113.32"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "headless", tk.Headless(), tk.ExternalIPs("203.0.113.33"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "headless-no-ext", tk.Headless(), tk.Ports(tk.TCP(80))),
			tk.Service("default", "extname", tk.ExternalName("db.example.com"), tk.ExternalIPs("203.0.113.34"), tk.Ports(tk.TCP(5432))),
			tk.Service("default", "bad-ips", tk.ClusterIPs("10.96.0.35"), tk.LoadBalancer("203.0.113.999", "2001:db8:e::zz", "203.0.113.35"),
				tk.ExternalIPs("not-an-ip", "fe80::1%eth0"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "v4-only", tk.ClusterIPs("10.96.0.36"), tk.LoadBalancer("203.0.113.36", "2001:db8:e::36"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "hostname", tk.ClusterIPs("10.96.0.37"), tk.IngressHostname("lb.example.com"), tk.Ports(tk.TCP(80))),
			// Ingress status of a non-LoadBalancer Service is ignored.
			tk.Service("default", "not-lb", tk.ClusterIPs("10.96.0.38"), func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.38"}}
			}, tk.Ports(tk.TCP(80))),
			tk.Service("default", "no-ports", tk.ClusterIPs("10.96.0.39"), tk.LoadBalancer("203.0.113.39")),
			tk.Service("default", "bad-cluster-ip", tk.ClusterIPs("10.96.0.999"), tk.LoadBalancer("203.0.113.40"), tk.Ports(tk.TCP(80))),
		))},
		{"conflicts", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			// Given out of order on purpose: a/first wins because of namespace/name order.
			tk.Service("b", "second", tk.ClusterIPs("10.96.0.12"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80), tk.TCP(81))),
			tk.Service("a", "first", tk.ClusterIPs("10.96.0.11"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80), tk.UDP(81))),
			tk.Service("c", "third", tk.ClusterIPs("10.96.0.13"), tk.ExternalIPs("203.0.113.10"), tk.Ports(tk.TCP(80))),
		))},
		{"no-pod-cidr", nil, tk.Snapshot(tk.WithNode(tk.Node("node-a")), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::10"), tk.Ports(tk.TCP(80))),
		))},
		{"v4-pod-cidr-only", nil, tk.Snapshot(tk.WithNode(tk.Node("node-a", tk.PodCIDRs("10.244.1.0/24"))), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::10"), tk.Ports(tk.TCP(80))),
		))},
		{"interface-prefix", map[string]any{"podInterfacePrefix": "cali"}, tk.Snapshot(tk.WithNode(tk.Node("node-a", tk.PodCIDRs("10.244.1.0/24"))), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::10"), tk.Ports(tk.TCP(80))),
		))},
		{"host-only", map[string]any{"fromPods": false}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80))),
		))},
		{"pods-only", map[string]any{"from-host": "false"}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80))),
		))},
		{"no-services", nil, tk.Snapshot(tk.WithNode(nodeA))},
		// Addresses with a meaning on the node are never DNATed, whoever wrote them into a Service:
		// each is skipped with its reason, and the ordinary address beside them still is programmed.
		{"special-addresses", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeWithAddresses), tk.WithServices(
			tk.Service("default", "hostile", tk.ClusterIPs("10.96.0.50", "fd00:10:96::50"),
				tk.LoadBalancer("127.0.0.1", "169.254.169.254", "0.0.0.0", "255.255.255.255", "224.0.0.1", "240.0.0.1",
					"0.1.2.3", "10.244.1.7", "192.168.10.5", "::1", "::", "fe80::1", "ff02::1", "::ffff:127.0.0.1",
					"::7f00:1", "fd00:10:244:1::7", "2001:db8:a::5", "203.0.113.50", "2001:db8:e::50"),
				tk.ExternalIPs("169.254.169.254", "100.64.0.50", "127.0.0.53"),
				tk.Ports(tk.TCP(80))),
		))},
		// allowedCIDRs narrows what the fix takes over; it cannot widen it to a refused address.
		{"allowed-cidrs", map[string]any{"allowedCIDRs": "203.0.113.0/26, 10.0.0.0/8,2001:db8:e::/64", "specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "inside", tk.ClusterIPs("10.96.0.60", "fd00:10:96::60"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::60"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "outside", tk.ClusterIPs("10.96.0.61", "fd00:10:96::61"), tk.LoadBalancer("203.0.113.70", "2001:db8:f::61"), tk.ExternalIPs("198.51.100.61"), tk.Ports(tk.TCP(80))),
			tk.Service("default", "pod-cidr", tk.ClusterIPs("10.96.0.62"), tk.LoadBalancer("10.244.1.62", "10.1.2.62"), tk.Ports(tk.TCP(80))),
		))},
		// Issue #19: by default spec.externalIPs (anyone who may create a Service writes them) are
		// not taken over; the ingress of the same Service is.
		{"external-ips-default", nil, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "cip", tk.ClusterIPType(), tk.ClusterIPs("10.96.0.20"), tk.ExternalIPs("203.0.113.20", "2001:db8:e::20"),
				tk.Ports(tk.TCP(80))),
			tk.Service("default", "lb", tk.ClusterIPs("10.96.0.22"), tk.LoadBalancer("203.0.113.22"), tk.ExternalIPs("203.0.113.22", "203.0.113.23"),
				tk.Ports(tk.TCP(80))),
		))},
		// Issue #19 item 1: another Service's Cluster-IP is never taken over, with spec.externalIPs
		// allowed and whoever writes the ingress: inside the Service CIDRs (service-cidr), and a
		// Cluster-IP outside them (cluster-ip, naming its Service).
		{"cluster-ip-takeover", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServiceCIDRs("10.96.0.0/16", "fd00:10:96::/112"), tk.WithServices(
			tk.Service("default", "kubernetes", tk.ClusterIPs("10.96.0.1", "fd00:10:96::1"), tk.Ports(tk.TCP(443))),
			tk.Service("kube-system", "kube-dns", tk.ClusterIPs("10.96.0.10", "fd00:10:96::a"), tk.Ports(tk.UDP(53), tk.TCP(53))),
			tk.Service("legacy", "outside", tk.ClusterIPs("10.97.0.5"), tk.Ports(tk.TCP(80))),
			tk.Service("tenant", "attacker", tk.ClusterIPType(), tk.ClusterIPs("10.96.0.66", "fd00:10:96::66"),
				tk.ExternalIPs("10.96.0.10", "10.96.0.1", "fd00:10:96::a", "10.96.200.1", "10.97.0.5", "203.0.113.66"),
				tk.Ports(tk.UDP(53), tk.TCP(443), tk.TCP(80))),
			tk.Service("tenant", "lb", tk.ClusterIPs("10.96.0.67"), tk.LoadBalancer("10.96.0.10", "203.0.113.67"), tk.Ports(tk.UDP(53))),
		))},
		// Without Service CIDRs (no ServiceCIDR objects, none configured) every Cluster-IP is refused
		// by name.
		{"cluster-ip-no-service-cidrs", map[string]any{"specExternalIPs": true}, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("kube-system", "kube-dns", tk.ClusterIPs("10.96.0.10"), tk.Ports(tk.UDP(53))),
			tk.Service("tenant", "attacker", tk.ClusterIPType(), tk.ClusterIPs("10.96.0.66"), tk.ExternalIPs("10.96.0.10", "203.0.113.66"),
				tk.Ports(tk.UDP(53))),
		))},
		// Issue #19 item 2: cloud metadata endpoints outside the IANA blocks, the IPv6 forms that
		// carry 169.254.169.254 to a translator or relay, and site-local; the ordinary addresses
		// beside them stay programmed.
		{"cloud-metadata", nil, tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
			tk.Service("default", "metadata", tk.ClusterIPs("10.96.0.80", "fd00:10:96::80"),
				tk.LoadBalancer("100.100.100.200", "168.63.129.16", "169.254.170.2", "fd00:ec2::254", "64:ff9b::a9fe:a9fe",
					"64:ff9b:1::a9fe:a9fe", "64:ff9b:1:a9fe:a9:fe00::", "2002:a9fe:a9fe::1", "2001:0:a9fe:a9fe::1",
					"2001:0:c000:20a:0:0:5601:5601", "::ffff:169.254.169.254", "fec0::1", "64:ff9b::7f00:1",
					"203.0.113.80", "64:ff9b::c000:250", "2001:db8:e::80"),
				tk.Ports(tk.TCP(80))),
		))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tk.Golden(t, "testdata/"+tc.name+".golden", tk.NewFixEnv(t, New, tc.options).Dump(tc.snap))
		})
	}
}

// TestRulesPure checks that Rules neither changes the snapshot nor depends on the order of Services.
func TestRulesPure(t *testing.T) {
	mk := func(order ...int) *fix.Snapshot {
		all := []*corev1.Service{
			tk.Service("a", "x", tk.ClusterIPs("10.96.0.1"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80))),
			tk.Service("a", "y", tk.ClusterIPs("10.96.0.2"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80))),
			tk.Service("b", "z", tk.ClusterIPs("10.96.0.3"), tk.ExternalIPs("203.0.113.11"), tk.Ports(tk.TCP(80))),
		}
		s := tk.Snapshot(tk.WithNode(nodeA))
		var svcs []*fix.Service
		for _, i := range order {
			svcs = append(svcs, fix.ServiceFrom(all[i])) // deliberately not sorted
		}
		inputs.Services.Set(s, svcs)
		return s
	}
	e := tk.NewFixEnv(t, New, nil)
	snap := mk(2, 1, 0)
	got := e.Dump(snap)
	if !reflect.DeepEqual(inputs.Services.Get(mk(2, 1, 0))[0], inputs.Services.Get(snap)[0]) {
		t.Error("Rules modified a Service of the snapshot")
	}
	if want := e.Dump(mk(0, 1, 2)); got != want {
		t.Errorf("Rules depends on the order of Services:\n%s\n---\n%s", got, want)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		options map[string]any
		want    []string
	}{
		{map[string]any{"masqueradeBit": 14}, []string{"masqueradeBit"}},
		{map[string]any{"localTraffic": map[string]any{"fromPods": true}}, []string{"localTraffic"}},
		{map[string]any{"specExternalIPs": "sometimes"}, []string{"specExternalIPs"}},
		{map[string]any{"masqueradeMark": "lots"}, []string{"masqueradeMark", `"lots"`}},
		{map[string]any{"fromPods": "maybe"}, []string{"fromPods"}},
		{map[string]any{"podInterfacePrefix": "a/b"}, []string{"podInterfacePrefix", `"a/b"`}},
		{map[string]any{"podInterfacePrefix": "averyveryverylongname"}, []string{"podInterfacePrefix"}},
		// 15 characters: neither iptables (-i prefix+) nor nftables (iifname "prefix*") can match it.
		{map[string]any{"podInterfacePrefix": "abcdefghijklmno"}, []string{"fixes.ipvs-externalip-dnat.podInterfacePrefix", "at most 14"}},
		{map[string]any{"fromPods": false, "fromHost": false}, []string{"fromPods", "fromHost"}},
		{map[string]any{"allowedCIDRs": "203.0.113.0/24,bogus"}, []string{"allowedCIDRs", `"bogus"`}},
		{map[string]any{"allowedCIDRs": []string{"10.0.0.1/8"}}, []string{"allowedCIDRs", "host bits", "10.0.0.0/8"}},
		{map[string]any{"allowedCIDRs": []any{"169.254.0.0/16"}}, []string{"allowedCIDRs", "169.254.0.0/16", "never DNATed"}},
		{map[string]any{"allowedCIDRs": "::1"}, []string{"allowedCIDRs", "::1", "loopback"}},
		{map[string]any{"allowedCIDRs": "::ffff:10.0.0.0/104"}, []string{"allowedCIDRs", "IPv4-mapped"}},
		{map[string]any{"allowedCIDRs": "fe80::1%eth0"}, []string{"allowedCIDRs", "fe80::1%eth0"}},
	}
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
		tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80)))))
	for _, tc := range cases {
		tk.NewFixEnv(t, New, map[string]any{"allowedCIDRs": "203.0.113.0/24"}).ConfigureFails(snap, tc.options, tc.want...)
	}
}

// TestMasqueradeMarkDeprecated: the key is still accepted in every form it was (an existing config
// keeps working), changes nothing in the rules, and each configuration that sets it logs a warning
// naming it. Bits once refused (kube-proxy's) are accepted too: nothing uses them any more.
func TestMasqueradeMarkDeprecated(t *testing.T) {
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
		tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.Ports(tk.TCP(80)))))
	want := tk.NewFixEnv(t, New, nil).Dump(snap)
	if plain := tk.NewFixEnv(t, New, nil); strings.Contains(plain.Logs.String(), "masqueradeMark") {
		t.Errorf("a warning about masqueradeMark without the key: %s", plain.Logs)
	}
	for _, v := range []any{"0x00400000", 4194304, "4194304", uint32(1), "0x4000", 0x8000, "0x3"} {
		e := tk.NewFixEnv(t, New, map[string]any{"masqueradeMark": v})
		if got := e.Dump(snap); got != want {
			t.Errorf("masqueradeMark %v changed the rules:\n%s\nwant\n%s", v, got, want)
		}
		if logs := e.Logs.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "fixes.ipvs-externalip-dnat.masqueradeMark is deprecated and ignored") {
			t.Errorf("masqueradeMark %v (%T): no deprecation warning in %q", v, v, logs)
		}
	}
	for _, bad := range []any{"lots", []string{"0x1000"}} {
		tk.NewFixEnv(t, New, nil).ConfigureFails(snap, map[string]any{"masqueradeMark": bad}, "masqueradeMark")
	}
}

func TestEnvironment(t *testing.T) {
	f := tk.NewFixEnv(t, New, nil).Fix
	for mode, want := range map[string]bool{"ipvs": true, "iptables": false, "nftables": false, "": false} {
		if got := f.DefaultEnabled(fix.Env{ProxyMode: mode}); got != want {
			t.Errorf("DefaultEnabled(%q) = %v", mode, got)
		}
	}
	for _, mode := range []string{"iptables", "nftables"} {
		err := f.Check(fix.Env{ProxyMode: mode})
		if err == nil || !strings.Contains(err.Error(), "refusing to run in kube-proxy "+mode+" mode") || !strings.Contains(err.Error(), "bypass") {
			t.Errorf("Check(%s) = %v", mode, err)
		}
	}
	for _, mode := range []string{"ipvs", ""} {
		if err := f.Check(fix.Env{ProxyMode: mode}); err != nil {
			t.Errorf("Check(%q) = %v", mode, err)
		}
	}
	if got := tk.Reads(f); got != "Services, Node, PodCIDRs, ServiceCIDRs" {
		t.Errorf("Reads = %s", got)
	}
	if !rules.ValidFixID(f.ID()) || f.ID() != "ipvs-externalip-dnat" || f.Description() == "" {
		t.Error("bad id or description")
	}
	for _, c := range []string{ChainPrerouting, ChainOutput, ChainDNAT, ChainPostrouting} {
		if len(c) > rules.MaxChainName {
			t.Errorf("chain name %s too long", c)
		}
	}
}

func TestMetrics(t *testing.T) {
	e := tk.NewFixEnv(t, New, nil)
	e.Dump(tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
		tk.Service("default", "a", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::10"), tk.ExternalIPs("203.0.113.20"),
			tk.Ports(tk.TCP(80), tk.UDP(80))),
		tk.Service("default", "b", tk.ClusterIPs("10.96.0.11"), tk.LoadBalancer("203.0.113.11"), tk.IngressProxyMode("203.0.113.30"), tk.Ports(tk.TCP(80))),
		tk.Service("default", "c", tk.Headless(), tk.ExternalIPs("203.0.113.33", "2001:db8:e::33"), tk.Ports(tk.TCP(80))),
	)))
	for name, want := range map[string]string{
		"nnm_ipvs_externalip_dnat_ips": `{family="ipv4"} 2` + "\n" + `{family="ipv6"} 1`,
		"nnm_ipvs_externalip_dnat_services": `{family="ipv4",state="covered"} 2` + "\n" + `{family="ipv4",state="skipped"} 3` + "\n" +
			`{family="ipv6",state="covered"} 1` + "\n" + `{family="ipv6",state="skipped"} 1`,
	} {
		if got := e.Metric(name); got != want {
			t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
		}
	}
	tk.Promlint(t, e.Registry)
}

// TestManyServices measures Rules on 1,000 dual-stack LoadBalancer Services with two ports each.
func TestManyServices(t *testing.T) {
	var svcs []*corev1.Service
	for i := range 1000 {
		svcs = append(svcs, tk.Service("ns", fmt.Sprintf("svc-%04d", i),
			tk.ClusterIPs(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), fmt.Sprintf("fd00:10:96::%x", i+1)),
			tk.LoadBalancer(fmt.Sprintf("203.0.%d.%d", 113+i/250, i%250+1), fmt.Sprintf("2001:db8:e::%x", i+1)),
			tk.Ports(tk.TCP(80), tk.TCP(443))))
	}
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(svcs...))
	e := tk.NewFixEnv(t, New, nil)
	start := time.Now()
	for _, fam := range rules.Families {
		rs, report := e.Sync(snap, fam)
		if report.Covered != 1000 || report.Items != 1000 || len(rs.Map(MapName).Entries) != 2000 {
			t.Fatalf("%s: covered=%d items=%d", fam, report.Covered, report.Items)
		}
	}
	t.Logf("Rules+fake Apply for 1000 dual-stack Services (4000 entries): %v", time.Since(start))
}

// TestREADMEDump checks the README's rule dump and skip reasons (the central fixes.TestFixes checks
// sections, example, options and metrics).
func TestREADMEDump(t *testing.T) {
	r := tk.ReadREADME(t, "README.md", ID)
	// The README's rule dump is what the fix produces for its example Service.
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
		tk.Service("default", "web", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.ETPLocal(),
			tk.Ports(tk.Named("http", tk.TCP(80)), tk.Named("dns", tk.UDP(53))))))
	rs, _ := tk.NewFixEnv(t, New, nil).Sync(snap, rules.IPv4)
	r.Contains(t, "the rule dump", strings.SplitN(tk.Format(rs), "\n", 2)[1])
	for _, reason := range []string{ReasonHeadless, ReasonExternalName, ReasonNoClusterIP, ReasonBadIP, ReasonIPModeProxy, ReasonConflict, ReasonNoPodCIDR, ReasonBadPort,
		ReasonSpecialAddress, ReasonCloudMetadata, ReasonPodCIDR, ReasonNodeAddress, ReasonServiceCIDR, ReasonClusterIP, ReasonNotAllowed,
		ReasonSpecExternalIP} {
		r.Contains(t, "skip reason "+reason, "`"+reason+"`")
	}
}

// TestIncrementalEqualsScratch: after any sequence of Service events the fix's rules and report
// equal those of a fresh fix on the same snapshot, byte for byte (the fix recomputes only the
// Services that changed; see fix.ServiceMap). fixes.TestIncrementalEqualsScratch runs a shorter
// version for every in-tree fix that reads Services.
func TestIncrementalEqualsScratch(t *testing.T) {
	tk.CheckIncremental(t, func() fix.RuleFix { return tk.NewFixEnv(t, New, nil).Fix }, tk.IncrementalOptions{})
}

// BenchmarkRulesOneNewService10k measures one IPv4 Rules call after one Service was added to 10,000
// (each with a Cluster-IP and an ingress IP), with the Service CIDRs known (the new Cluster-IP lies
// in them: only the new Service is computed) and unknown (every Cluster-IP is refused by name, so
// a new one changes the guard and every Service is computed again).
func BenchmarkRulesOneNewService10k(b *testing.B) {
	svc := scaleService
	for _, bc := range []struct {
		name  string
		cidrs []string
	}{{"service-cidrs-known", []string{"10.96.0.0/16"}}, {"service-cidrs-unknown", nil}} {
		b.Run(bc.name, func(b *testing.B) {
			var svcs []*corev1.Service
			for i := range 10000 {
				svcs = append(svcs, svc(i))
			}
			f := tk.NewFixEnv(b, New, nil).Fix
			snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServiceCIDRs(bc.cidrs...), tk.WithServices(svcs...))
			if _, _, err := f.Rules(snap, rules.IPv4); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				s := snap.Clone()
				inputs.Services.Set(s, append(slices.Clip(inputs.Services.Get(snap)), fix.ServiceFrom(svc(10000+i%5000))))
				if _, _, err := f.Rules(s, rules.IPv4); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// scaleService is the i-th Service of the benchmarks: a Cluster-IP in 10.96.0.0/16, an ingress IP,
// one TCP port.
func scaleService(i int) *corev1.Service {
	return tk.Service("ns", fmt.Sprintf("svc-%05d", i), tk.ClusterIPs(fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)),
		tk.LoadBalancer(fmt.Sprintf("198.18.%d.%d", i/250, i%250+1)), tk.Ports(tk.TCP(80)))
}

// BenchmarkRulesCold10k measures a fresh fix's first IPv4 Rules call over 10,000 Services (the
// agent's cold start), the fix's construction included.
func BenchmarkRulesCold10k(b *testing.B) {
	var svcs []*corev1.Service
	for i := range 10000 {
		svcs = append(svcs, scaleService(i))
	}
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServiceCIDRs("10.96.0.0/16"), tk.WithServices(svcs...))
	b.ReportAllocs()
	for b.Loop() {
		f := tk.NewFixEnv(b, New, nil).Fix
		if rs, _, err := f.Rules(snap, rules.IPv4); err != nil || len(rs.Maps[0].Entries) != len(svcs) {
			b.Fatalf("Rules: %v, want %d entries", err, len(svcs))
		}
	}
}

// A Service with a list the input does not hold (fix.MaxHeldPerService) is skipped under the
// service budget when it has an external address, or when the list not held is one of addresses;
// a Service with too many ports and no external address yet is neither programmed nor reported;
// the others are programmed.
func TestOversizedServices(t *testing.T) {
	var many []tk.PortSpec
	for p := range fix.MaxHeldPerService + 1 {
		many = append(many, tk.TCP(int32(p+1)))
	}
	var ips []string
	for i := range fix.MaxHeldPerService + 1 {
		ips = append(ips, netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String())
	}
	snap := tk.Snapshot(tk.WithNode(nodeA), tk.WithServices(
		tk.Service("t", "many-ports", tk.ClusterIPs("10.96.0.10"), tk.LoadBalancer("203.0.113.10"), tk.Ports(many...)),
		tk.Service("t", "many-ports-no-ip", tk.ClusterIPs("10.96.0.11"), tk.Ports(many...)),
		tk.Service("t", "many-ips", tk.ClusterIPs("10.96.0.12"), tk.ExternalIPs(ips...), tk.Ports(tk.TCP(80))),
		tk.Service("t", "normal", tk.ClusterIPs("10.96.0.13"), tk.LoadBalancer("203.0.113.13"), tk.Ports(tk.TCP(80))),
	))
	e := tk.NewFixEnv(t, New, map[string]any{"specExternalIPs": true})
	rs, report := e.Sync(snap, rules.IPv4)
	got := map[string]string{}
	for _, s := range report.Skipped {
		got[s.Object] = s.Reason
	}
	want := map[string]string{"t/many-ports": fix.ReasonServiceBudget, "t/many-ips": fix.ReasonServiceBudget}
	if !maps.Equal(got, want) {
		t.Errorf("skips %v, want %v (%+v)", got, want, report.Skipped)
	}
	if entries := rs.Map(MapName).Entries; len(entries) != 1 || entries[0].Addr != netip.MustParseAddr("203.0.113.13") || report.Covered != 1 {
		t.Errorf("entries %v, covered %d; want t/normal's one", entries, report.Covered)
	}
}
