package dataplane

// External-IP unreachable from inside the cluster in kube-proxy IPVS mode with
// externalTrafficPolicy: Local on a node without a local endpoint (kubernetes#75262), and the
// ipvs-externalip-dnat fix.
//
// EMULATION. This kernel has no IPVS, so the node namespace imitates what kube-proxy's IPVS mode sets up
// on such a node:
//
//   - kube-ipvs0 holds every Cluster-IP and every External-IP (LoadBalancer ingress) as /32 and /128
//     addresses. kube-proxy uses a dummy link; this kernel has none, so kube-ipvs0 is a veth whose peer
//     (ipvs0-peer) also stays in the node namespace. Like with IPVS, those addresses are local: traffic
//     to them is delivered on the node (INPUT).
//   - The IPVS virtual server of a Cluster-IP is a TCP forwarder (Go, in the test) listening on
//     Cluster-IP:port inside the node namespace; it relays each connection to the backend namespace,
//     whose server answers "hello from <backend namespace>" and closes. Every node serves Cluster-IPs,
//     whatever the Service's traffic policy.
//   - The External-IP:80 virtual server has no real server (eTP=Local, no local endpoint). IPVS then
//     drops such a packet and answers with ICMP port unreachable (ip_vs_leave); a table of the test's
//     own, `table inet ipvs-emu`, does the same in INPUT for exactly (External-IP, tcp, 80). Like with
//     IPVS, other ports of the External-IP reach the node's stack (nothing listens: RST), and replies
//     addressed to the External-IP (a host-network client's source address) pass.
//   - kube-proxy would not bind an ipMode: Proxy ingress IP; here it is bound and rejected like the
//     other one, so that a wrong short-circuit of it would be exercised on the host-network (OUTPUT)
//     path as well and be seen.
//   - Negative controls the forwarder serves beyond what IPVS would: port 81 on the web Service's
//     Cluster-IP (the Service exposes only 80), and port 80 on the Cluster-IP of the Service whose
//     ingress says ipMode: Proxy. A rule that ignored the port, or short-circuited the Proxy Service,
//     would therefore reach the backend, and the test would see it.
//
// Topology (all addresses exist only in the test's namespaces):
//
//	pod     eth0 10.244.1.2/24  fd00:10:244:1::2/64      default via the node
//	 |
//	node    pod0 10.244.1.1/24  fd00:10:244:1::1/64      (pod CIDRs 10.244.1.0/24, fd00:10:244:1::/64)
//	        kube-ipvs0  10.96.0.10 fd00:10:96::a          Cluster-IPs of default/web
//	                    10.96.0.11 fd00:10:96::b          Cluster-IPs of default/proxied
//	                    203.0.113.10 2001:db8::10         External-IPs of default/web (ipMode VIP)
//	                    203.0.113.11 2001:db8::11         External-IPs of default/proxied (ipMode Proxy)
//	        bk0  198.51.100.1/24  2001:db8:2::1/64
//	 |
//	backend eth0 198.51.100.2/24  2001:db8:2::2/64       server on :8080
//
// Cluster objects (shared control plane, service CIDRs 10.96.0.0/16, fd00:10:96::/112):
//
//	default/web      LoadBalancer, RequireDualStack, eTP Local, port http 80/TCP,
//	                 ingress 203.0.113.10, 2001:db8::10
//	default/proxied  the same on 10.96.0.11 / fd00:10:96::b, ingress 203.0.113.11, 2001:db8::11 with
//	                 ipMode: Proxy
//
// Without the agent, a pod client and a host-network client (a socket in the node namespace) cannot
// reach External-IP:80, while both reach Cluster-IP:80 (so the emulation itself works). With the agent
// (--proxy-mode ipvs, iptables then nftables backend) both reach the backend through External-IP:80,
// and External-IP:81 and the Proxy Service's External-IP stay unreachable. Both families each time.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// extipPlan is the address plan of one family.
type extipPlan struct {
	family       string
	clusterIP    netip.Addr // default/web
	proxyCluster netip.Addr // default/proxied
	extIP        netip.Addr // default/web ingress (VIP)
	proxyExtIP   netip.Addr // default/proxied ingress (Proxy)
	backend      netip.Addr
	pod          netip.Addr // the pod's address: what the backend sees when nothing masquerades
}

var extipPlans = []extipPlan{
	{"ipv4", ip("10.96.0.10"), ip("10.96.0.11"), ip("203.0.113.10"), ip("203.0.113.11"), ip("198.51.100.2"), ip("10.244.1.2")},
	{"ipv6", ip("fd00:10:96::a"), ip("fd00:10:96::b"), ip("2001:db8::10"), ip("2001:db8::11"), ip("2001:db8:2::2"), ip("fd00:10:244:1::2")},
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

const (
	backendPort = 8080
	// peerPort is the backend's second server: it answers with the client's address as it arrives.
	peerPort = 8081
	podCIDRs = "10.244.1.0/24,fd00:10:244:1::/64"
)

// ipvsEmuRuleset rejects what reaches the External-IP virtual servers as IPVS does without a real
// server (eTP=Local and no local endpoint): drop, ICMP port unreachable. (Here the Cluster-IP's
// virtual server is a relay in the node, so the backend sees the node either way; that the fix
// masquerades what it DNATed, and nothing else, is proved with real packets in
// fixes/ipvsexternalipdnat's TestKernelNeighbourMark.)
var ipvsEmuRuleset = `
table inet ipvs-emu {
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr . tcp dport { 203.0.113.10 . 80, 203.0.113.11 . 80 } counter reject with icmpx type port-unreachable
		ip6 daddr . tcp dport { 2001:db8::10 . 80, 2001:db8::11 . 80 } counter reject with icmpx type port-unreachable
	}
}
`

// seedCluster creates the two Services and sets their load-balancer status.
func seedCluster(ctx context.Context, cp *controlplane.ControlPlane) error {
	svcs := cp.AdminClient().CoreV1().Services("default")
	for _, d := range []struct {
		name      string
		clusterIP func(extipPlan) netip.Addr
		extIP     func(extipPlan) netip.Addr
		mode      corev1.LoadBalancerIPMode
	}{
		{"web", func(p extipPlan) netip.Addr { return p.clusterIP }, func(p extipPlan) netip.Addr { return p.extIP }, corev1.LoadBalancerIPModeVIP},
		{"proxied", func(p extipPlan) netip.Addr { return p.proxyCluster }, func(p extipPlan) netip.Addr { return p.proxyExtIP }, corev1.LoadBalancerIPModeProxy},
	} {
		policy := corev1.IPFamilyPolicyRequireDualStack
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: d.name, Namespace: "default"},
			Spec: corev1.ServiceSpec{
				Type:                  corev1.ServiceTypeLoadBalancer,
				IPFamilyPolicy:        &policy,
				IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
				Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(backendPort)}},
				Selector:              map[string]string{"app": d.name},
			},
		}
		var ingress []corev1.LoadBalancerIngress
		for _, p := range extipPlans {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, d.clusterIP(p).String())
			mode := d.mode
			ingress = append(ingress, corev1.LoadBalancerIngress{IP: d.extIP(p).String(), IPMode: &mode})
		}
		svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
		created, err := svcs.Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create Service %s: %w", d.name, err)
		}
		created.Status.LoadBalancer.Ingress = ingress
		updated, err := svcs.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("set load-balancer status of %s: %w", d.name, err)
		}
		got := updated.Status.LoadBalancer.Ingress
		if len(got) != len(ingress) {
			return fmt.Errorf("Service %s: ingress %v after UpdateStatus, want %v", d.name, got, ingress)
		}
		for _, in := range got {
			if in.IPMode == nil || *in.IPMode != d.mode {
				return fmt.Errorf("Service %s: the apiserver did not keep ipMode %s on %s (LoadBalancerIPMode feature off?)", d.name, d.mode, in.IP)
			}
		}
	}
	return nil
}

type extipTopo struct{ pod, node, backend *netns.NS }

func newExtIPTopo(t *testing.T) *extipTopo {
	t.Helper()
	tp := &extipTopo{pod: netns.NewNoDAD(t, "nnmdp-pod"), node: netns.NewNoDAD(t, "nnmdp-node"), backend: netns.NewNoDAD(t, "nnmdp-bk")}
	tp.node.Veth("pod0", tp.pod, "eth0")
	tp.node.Veth("bk0", tp.backend, "eth0")
	tp.node.Veth("kube-ipvs0", tp.node, "ipvs0-peer")
	tp.pod.AddAddrs("eth0", "10.244.1.2/24", "fd00:10:244:1::2/64")
	tp.node.AddAddrs("pod0", "10.244.1.1/24", "fd00:10:244:1::1/64")
	tp.node.AddAddrs("bk0", "198.51.100.1/24", "2001:db8:2::1/64")
	tp.backend.AddAddrs("eth0", "198.51.100.2/24", "2001:db8:2::2/64")
	for _, p := range extipPlans {
		for _, a := range []netip.Addr{p.clusterIP, p.proxyCluster, p.extIP, p.proxyExtIP} {
			tp.node.AddAddrs("kube-ipvs0", netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
	tp.pod.MustExec("ip", "route", "add", "default", "via", "10.244.1.1")
	tp.pod.MustExec("ip", "-6", "route", "add", "default", "via", "fd00:10:244:1::1")
	// The backend routes pod addresses back through the node, as a cluster network would: a pod's
	// connection to it arrives with the pod's address unless the node masquerades it.
	tp.backend.MustExec("ip", "route", "add", "10.244.1.0/24", "via", "198.51.100.1")
	tp.backend.MustExec("ip", "-6", "route", "add", "fd00:10:244:1::/64", "via", "2001:db8:2::1")
	tp.node.MustExec("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	tp.node.NftLoad(ipvsEmuRuleset)

	serveBackend(t, tp.backend)
	routes := map[netip.AddrPort]netip.AddrPort{}
	for _, p := range extipPlans {
		be := ap(p.backend, backendPort)
		routes[ap(p.clusterIP, 80)] = be    // the IPVS virtual server of default/web
		routes[ap(p.clusterIP, 81)] = be    // negative control: a port the Service does not expose
		routes[ap(p.proxyCluster, 80)] = be // negative control: the ipMode: Proxy Service
	}
	startForwarder(t, tp.node, routes)
	return tp
}

// backendBody is what the backend in ns answers.
func backendBody(ns *netns.NS) string { return "hello from " + ns.Name + "\n" }

// serveBackend answers every connection on :backendPort (both families) with backendBody, and on
// :peerPort with the client's address (peerBody), and closes it.
func serveBackend(t *testing.T, ns *netns.NS) {
	for port, body := range map[int]func(net.Conn) string{
		backendPort: func(net.Conn) string { return backendBody(ns) },
		peerPort: func(c net.Conn) string {
			return peerBody(netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap())
		},
	} {
		netns.Serve(ns.Listen(t, fmt.Sprintf(":%d", port)), func(c net.Conn) {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, body(c))
			c.Close()
		})
	}
}

// peerBody is what the backend's peerPort answers to a client whose packets arrive from a.
func peerBody(a netip.Addr) string { return "you are " + a.String() + "\n" }

// checkNotMasqueraded fails t unless a pod's connection to the backend itself (no Service address,
// forwarded by the node) arrives with the pod's own source address: the fix masquerades only the
// connections it DNATed.
func checkNotMasqueraded(t *testing.T, label string, tp *extipTopo) {
	t.Helper()
	for _, p := range extipPlans {
		body, err := fetch(t.Context(), tp.pod, ap(p.backend, peerPort), probeTimeout)
		if want := peerBody(p.pod); err != nil || body != want {
			t.Errorf("%s: %s pod → backend %s:%d (no Service): %q, %v; want %q (not masqueraded)", label, p.family, p.backend, peerPort, body, err, want)
		}
	}
}

// startForwarder listens on each key of routes inside node and relays every connection to the
// route's target, dialing from node: the stand-in for an IPVS virtual server.
func startForwarder(t *testing.T, node *netns.NS, routes map[netip.AddrPort]netip.AddrPort) {
	t.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
		lns   []net.Listener
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	for from, to := range routes {
		ln := node.Listen(t, from.String())
		lns = append(lns, ln)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				track(c)
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					up, err := dial(context.Background(), node.Path(), to, 2*time.Second)
					if err != nil {
						return
					}
					track(up)
					defer up.Close()
					go func() { _, _ = io.Copy(up, c) }()
					_, _ = io.Copy(c, up)
				}()
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// probe is one connection attempt and its expected outcome.
type probe struct {
	name  string
	from  *netns.NS
	to    netip.AddrPort
	reach bool // the backend's answer is expected
}

// fromBoth probes dst (what it is follows the family in the probe's name) from the pod and from the
// node itself (a host-network process).
func (tp *extipTopo) fromBoth(family, what string, dst netip.AddrPort, reach bool) []probe {
	return []probe{
		{family + " pod → " + what, tp.pod, dst, reach},
		{family + " host → " + what, tp.node, dst, reach},
	}
}

// probeTimeout bounds one attempt (failures are expected to be quick: ICMP unreachable or RST).
const probeTimeout = 3 * time.Second

// runProbes runs the probes concurrently and reports every outcome that differs from the expectation.
func runProbes(t *testing.T, label string, want string, probes []probe) {
	t.Helper()
	fns := make([]func() string, len(probes))
	for i, pr := range probes {
		fns[i] = func() string {
			body, err := fetch(t.Context(), pr.from, pr.to, probeTimeout)
			reached := err == nil && body == want
			outcome := "reached the backend"
			if !reached {
				outcome = fmt.Sprintf("unreachable (%v, body %q)", err, body)
			}
			line := fmt.Sprintf("%s: %s → %s: %s", label, pr.name, pr.to, outcome)
			if reached != pr.reach {
				return "FAIL " + line
			}
			return "ok   " + line
		}
	}
	for _, r := range parallel(fns...) {
		if strings.HasPrefix(r, "FAIL") {
			t.Error(r)
		} else {
			t.Log(r)
		}
	}
}

func TestExternalIPFromInside(t *testing.T) {
	require(t, "nft", "sysctl")
	cp := controlPlane(t)

	reproduced := t.Run("without-agent", func(t *testing.T) {
		tp := newExtIPTopo(t)
		var probes []probe
		for _, p := range extipPlans {
			probes = slices.Concat(probes,
				tp.fromBoth(p.family, "Cluster-IP (control)", ap(p.clusterIP, 80), true),
				tp.fromBoth(p.family, "External-IP", ap(p.extIP, 80), false))
		}
		runProbes(t, "without agent", backendBody(tp.backend), probes)
		checkNotMasqueraded(t, "without agent", tp)
	})
	if !reproduced {
		t.Fatal("the problem did not reproduce without the agent, so the runs with the agent would prove nothing")
	}

	for _, be := range backends {
		t.Run("with-agent/"+be, func(t *testing.T) {
			tp := newExtIPTopo(t)
			kubeconfig, err := cp.ConnectNamespace(tp.node.Name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cp.DisconnectNamespace(tp.node.Name) })
			agent := agenttest.StartT(t, agenttest.Options{Netns: tp.node.Name, Args: []string{
				"--backend", be, "--proxy-mode", "ipvs", "--pod-cidrs", podCIDRs,
				"--kubeconfig", kubeconfig, "--node-name", tp.node.Name,
				"--disable-fix", "invalid-drop", "--log-level", "debug",
			}})
			agent.WaitReadyT(t, 30*time.Second)
			want := backendBody(tp.backend)
			// Ready means synced, but give the first rules a moment in case they trail readiness.
			took := agenttest.Eventually(t, 10*time.Second, func() error {
				body, err := fetch(t.Context(), tp.pod, ap(extipPlans[0].extIP, 80), probeTimeout)
				if err != nil || body != want {
					return fmt.Errorf("pod → %s: %v %q", extipPlans[0].extIP, err, body)
				}
				return nil
			})
			t.Logf("%s: first pod → External-IP success %v after /readyz", be, took.Round(time.Millisecond))
			var probes []probe
			for _, p := range extipPlans {
				probes = slices.Concat(probes,
					tp.fromBoth(p.family, "External-IP", ap(p.extIP, 80), true),
					tp.fromBoth(p.family, "External-IP, unexposed port", ap(p.extIP, 81), false),
					tp.fromBoth(p.family, "ipMode Proxy External-IP", ap(p.proxyExtIP, 80), false))
			}
			runProbes(t, "with agent ("+be+")", want, probes)
			checkNotMasqueraded(t, "with agent ("+be+")", tp)
			m := agent.MetricsT(t)
			for _, p := range extipPlans {
				v, ok := m.Value("nnm_ipvs_externalip_dnat_ips", "family", p.family)
				t.Logf("with agent (%s): nnm_ipvs_externalip_dnat_ips{family=%q} = %v (present %v)", be, p.family, v, ok)
			}
		})
	}
}
