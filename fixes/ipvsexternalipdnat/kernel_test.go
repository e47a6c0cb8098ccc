package ipvsexternalipdnat

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// The kernel test programs the fix's rules (each backend in turn, both families) in a node namespace
// beside a neighbour that uses the fix's former mark bit 0x1000 on its own packets (issue #41, row
// 8), and checks with real connections that
//
//   - the fix's DNATed traffic (pod → External-IP:80 and host → External-IP:80) reaches the backend
//     that holds the Cluster-IP, masqueraded to the node's address;
//   - the neighbour's packets keep their mark (0x1000 ORed in prerouting on a pod's connection,
//     Cilium-like 0x1E00 set in output on a host connection) through the fix's nat chains, and are not
//     masqueraded, also when the bit is set after the fix's DNAT chain ran (in forward).
//
// Address plan (only in the test's namespaces):
//
//	pod      eth0 10.244.1.2/24   fd00:10:244:1::2/64      default via the node
//	node     pod0 10.244.1.1/24   fd00:10:244:1::1/64      pod CIDRs 10.244.1.0/24, fd00:10:244:1::/64
//	         ext0 203.0.113.10/32 2001:db8:e::10/128       the External-IPs, local as with IPVS
//	         bk0  198.51.100.1/24 2001:db8:2::1/64         Cluster-IPs routed to the backend
//	backend  eth0 198.51.100.2/24 2001:db8:2::2/64         default via the node
//	         lo   10.96.0.10/32   fd00:10:96::10/128       the Cluster-IPs (stand-in for IPVS's real server)
//
// Every server of the backend answers "you are <source address>": who masqueraded shows.
type markPlan struct {
	family              rules.Family
	pod, podGW          netip.Addr
	extIP, clusterIP    netip.Addr
	nodeUplink, backend netip.Addr
}

var markPlans = []markPlan{
	{rules.IPv4, ip("10.244.1.2"), ip("10.244.1.1"), ip("203.0.113.10"), ip("10.96.0.10"), ip("198.51.100.1"), ip("198.51.100.2")},
	{rules.IPv6, ip("fd00:10:244:1::2"), ip("fd00:10:244:1::1"), ip("2001:db8:e::10"), ip("fd00:10:96::10"), ip("2001:db8:2::1"), ip("2001:db8:2::2")},
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// Ports of the backend's servers: the Service port, and two ports of the neighbour's own traffic.
const (
	svcPort       = 80
	nbrPrePort    = 8081 // the neighbour ORs 0x1000 in prerouting (pod) and sets 0x1E00 in output (host)
	nbrFwdPort    = 8082 // the neighbour ORs 0x1000 in forward, after the fix's DNAT chain
	neighbourMark = 0x1000
	ciliumMark    = 0x1e00
)

// neighbourRuleset is the neighbour's own table. Its counters count the first packet of each of its
// connections (ct state new: the one that walks the nat chains) arriving in postrouting, before any
// nat postrouting chain (priority 50), with the mark it set still whole.
func neighbourRuleset() string {
	var counters, kept []string
	for _, p := range markPlans {
		a := "ip"
		if p.family == rules.IPv6 {
			a = "ip6"
		}
		counters = append(counters, fmt.Sprintf("counter kept-pod-%[1]s { }\n\tcounter kept-host-%[1]s { }", p.family))
		kept = append(kept,
			fmt.Sprintf("ct state new %s saddr %s tcp dport %d meta mark 0x%x counter name \"kept-pod-%s\"", a, p.pod, nbrPrePort, neighbourMark, p.family),
			fmt.Sprintf("ct state new %s saddr %s tcp dport %d meta mark 0x%x counter name \"kept-host-%s\"", a, p.podGW, nbrPrePort, ciliumMark, p.family))
	}
	return fmt.Sprintf(`
table inet neighbour {
	%[5]s
	chain nbr-pre {
		type filter hook prerouting priority -150; policy accept;
		iifname "pod0" tcp dport %[1]d meta mark set meta mark | 0x%[3]x
	}
	chain nbr-fwd {
		type filter hook forward priority 0; policy accept;
		iifname "pod0" tcp dport %[2]d meta mark set meta mark | 0x%[3]x
	}
	chain nbr-out {
		type route hook output priority -150; policy accept;
		tcp dport %[1]d meta mark set 0x%[4]x
	}
	chain nbr-post {
		type filter hook postrouting priority 50; policy accept;
		%[6]s
	}
}
`, nbrPrePort, nbrFwdPort, neighbourMark, ciliumMark, strings.Join(counters, "\n\t"), strings.Join(kept, "\n\t\t"))
}

type markLab struct{ pod, node, backend *netns.NS }

func newMarkLab(t *testing.T) *markLab {
	t.Helper()
	l := &markLab{pod: netns.NewNoDAD(t, "nnm-mark-pod"), node: netns.NewNoDAD(t, "nnm-mark-node"), backend: netns.NewNoDAD(t, "nnm-mark-bk")}
	l.node.Veth("pod0", l.pod, "eth0")
	l.node.Veth("bk0", l.backend, "eth0")
	l.node.Veth("ext0", l.node, "ext0-peer")
	for _, p := range markPlans {
		bits := "/24"
		if p.family == rules.IPv6 {
			bits = "/64"
		}
		l.pod.AddAddrs("eth0", p.pod.String()+bits)
		l.node.AddAddrs("pod0", p.podGW.String()+bits)
		l.node.AddAddrs("ext0", netip.PrefixFrom(p.extIP, p.extIP.BitLen()).String())
		l.node.AddAddrs("bk0", p.nodeUplink.String()+bits)
		l.backend.AddAddrs("eth0", p.backend.String()+bits)
		l.backend.AddAddrs("lo", netip.PrefixFrom(p.clusterIP, p.clusterIP.BitLen()).String())
		ipf := "-4"
		if p.family == rules.IPv6 {
			ipf = "-6"
		}
		l.pod.MustExec("ip", ipf, "route", "add", "default", "via", p.podGW.String())
		l.backend.MustExec("ip", ipf, "route", "add", "default", "via", p.nodeUplink.String())
		l.node.MustExec("ip", ipf, "route", "add", p.clusterIP.String(), "via", p.backend.String())
	}
	l.node.MustExec("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	l.node.NftLoad(neighbourRuleset())
	for _, port := range []int{svcPort, nbrPrePort, nbrFwdPort} {
		netns.Serve(l.backend.Listen(t, fmt.Sprintf(":%d", port)), func(c net.Conn) {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, youAre(netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()))
		})
	}
	return l
}

func youAre(a netip.Addr) string { return "you are " + a.String() + "\n" }

// ask connects from ns (from the local address src when valid) to dst and returns the answer.
func ask(ctx context.Context, ns *netns.NS, src netip.Addr, dst netip.AddrPort) (string, error) {
	var c net.Conn
	d := &net.Dialer{Timeout: 2 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	if err := ns.Do(func() (err error) { c, err = d.DialContext(ctx, "tcp", dst.String()); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// counter reads a packet counter of the neighbour's table.
func (l *markLab) counter(t *testing.T, name string) int {
	t.Helper()
	out := l.node.MustExec("nft", "list", "counter", "inet", "neighbour", name)
	i := strings.Index(out, "packets ")
	var n int
	if i < 0 {
		t.Fatalf("no packet count in %q", out)
	}
	if _, err := fmt.Sscanf(out[i:], "packets %d", &n); err != nil {
		t.Fatalf("packet count in %q: %v", out, err)
	}
	return n
}

// TestKernelNeighbourMark: beside a neighbour that sets the fix's former mark bit on its own packets,
// with each backend and both families, the fix's DNATed connections are masqueraded and reach the
// Cluster-IP's backend, and the neighbour's connections keep their mark and their source address.
func TestKernelNeighbourMark(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-restore", "ip6tables-nft-restore", "nft", "sysctl")
	if testing.Short() {
		t.Skip("kernel test")
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	snap := tk.Snapshot(tk.WithNode(tk.Node("node-a", tk.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))), tk.WithServices(
		tk.Service("default", "web", tk.ClusterIPs("10.96.0.10", "fd00:10:96::10"), tk.LoadBalancer("203.0.113.10", "2001:db8:e::10"),
			tk.ETPLocal(), tk.Ports(tk.Named("http", tk.TCP(svcPort)))),
	))
	for _, name := range backends.Names {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			l := newMarkLab(t)
			be, err := backends.New(name, "nft", log)
			if err != nil {
				t.Fatal(err)
			}
			f, err := New(fix.Params{Backend: be})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range markPlans {
				rs, _, err := f.Rules(snap, p.family)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.node.Do(func() error { return tk.Apply(ctx, be, rs) }); err != nil {
					t.Fatalf("apply %s: %v", p.family, err)
				}
				// The read-back of the conntrack matches is what was applied: no repair on the next verify.
				var inSync bool
				if err := l.node.Do(func() (err error) { inSync, err = tk.InSync(ctx, be, rs); return err }); err != nil || !inSync {
					t.Fatalf("%s: verify after apply: in sync %v, %v", p.family, inSync, err)
				}
			}
			for _, p := range markPlans {
				// The path works (IPv6 may wait for neighbour discovery) before anything counts.
				if err := agenttest.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
					_, err := ask(ctx, l.pod, netip.Addr{}, netip.AddrPortFrom(p.backend, nbrFwdPort))
					return err
				}); err != nil {
					t.Fatalf("%s: the pod cannot reach the backend: %v", p.family, err)
				}
				check := func(what string, from *netns.NS, src netip.Addr, dst netip.AddrPort, want netip.Addr) {
					t.Helper()
					got, err := ask(ctx, from, src, dst)
					if err != nil || got != youAre(want) {
						t.Errorf("%s %s → %s: %q, %v; want %q", p.family, what, dst, got, err, youAre(want))
					} else {
						t.Logf("%s %s → %s: %q", p.family, what, dst, strings.TrimSpace(got))
					}
				}
				ext := netip.AddrPortFrom(p.extIP, svcPort)
				check("pod (DNATed by the fix)", l.pod, netip.Addr{}, ext, p.nodeUplink)
				check("host (DNATed by the fix)", l.node, netip.Addr{}, ext, p.nodeUplink)

				podKept, hostKept := l.counter(t, "kept-pod-"+string(p.family)), l.counter(t, "kept-host-"+string(p.family))
				check("pod, neighbour's 0x1000 from prerouting", l.pod, netip.Addr{}, netip.AddrPortFrom(p.backend, nbrPrePort), p.pod)
				check("pod, neighbour's 0x1000 from forward", l.pod, netip.Addr{}, netip.AddrPortFrom(p.backend, nbrFwdPort), p.pod)
				check("host from a pod-side address, Cilium-like 0x1E00 from output", l.node, p.podGW, netip.AddrPortFrom(p.backend, nbrPrePort), p.podGW)
				if n := l.counter(t, "kept-pod-"+string(p.family)) - podKept; n < 1 {
					t.Errorf("%s: the pod's connection reached postrouting without the neighbour's mark 0x%x (the fix changed it)", p.family, neighbourMark)
				}
				if n := l.counter(t, "kept-host-"+string(p.family)) - hostKept; n < 1 {
					t.Errorf("%s: the host's connection reached postrouting without the neighbour's mark 0x%x (the fix changed it)", p.family, ciliumMark)
				}
			}
		})
	}
}
