package vm

// The guest half of the VM lane: runs inside the VM (kernel 6.1 with IP_VS) that
// TestKubeProxyIPVSInVM boots, as root in the guest's initial network namespace, which is the node.
// What it proves that no host lane can (the host kernel has no IP_VS; dataplane/externalip_test.go
// emulates IPVS): kubernetes#75262 and the connection reset beside a real kube-proxy in IPVS mode,
// and both fixes with each backend on kernel 6.1 (see doc.go for every lane).
// Both families, addresses in plans (host_test.go):
//
//	node (guest root netns)                      kube-proxy --proxy-mode=ipvs, the agent
//	  eth0  10.0.2.15/24, fd00:10:0:2::15/64 (InternalIPs; qemu user network, restricted; no default route)
//	  kube-ipvs0 (dummy, made by kube-proxy)      203.0.113.10, 2001:db8:113::10 (lb-local), ClusterIPs
//	  pod0  10.244.1.1/24 fd00:10:244:1::1/64 <-> netns pod  eth0 10.244.1.2, fd00:10:244:1::2 (default via node)
//	  rem0  10.244.2.1/24 fd00:10:244:2::1/64 <-> netns ep   eth0 10.244.2.2, fd00:10:244:2::2: TCP :8080,
//	                                        the Service's only endpoint, on another node as far as the API says
//	  ext0  192.0.2.1/24 2001:db8:1::1/64    <-> netns nnmdp-ext eth0 192.0.2.2, 2001:db8:1::2: the
//	                                        connection-reset reproduction's external server (internal/testing/resettest)

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// nodeNetns names the guest's initial namespace, so that the netns-based helpers address it.
const nodeNetns = "node"

const dialWait = 2 * time.Second

func requireGuest(t *testing.T) {
	t.Helper()
	if os.Getenv(guestEnv) == "" {
		t.Skip("guest half: runs inside the VM that the host half boots")
	}
}

// sh runs a command in the guest's initial namespace and fails the test on error.
func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// guestTopology builds the pod and endpoint namespaces around the node and starts the endpoint.
func guestTopology(t *testing.T) (pod *netns.NS) {
	t.Helper()
	sh(t, "ip", "netns", "attach", nodeNetns, "1")
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", nodeNetns).Run() })
	sh(t, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	sh(t, "ip", "addr", "add", plans[1].nodeIP+"/64", "dev", "eth0", "nodad")
	pod = netns.New(t, "pod")
	ep := netns.New(t, "ep")
	for _, l := range []struct {
		ns     *netns.NS
		nodeIf string
		nodeIP func(plan) string
		nsIP   func(plan) string
		route  func(plan) string
	}{
		{pod, resettest.PodLink, func(p plan) string { return p.podGW }, func(p plan) string { return p.podIP }, func(plan) string { return "default" }},
		// The endpoint's node routes this node's pod CIDR back here, as a CNI does, but not the
		// External-IP: in a cluster that address leads to the load balancer, not to this node.
		{ep, "rem0", func(p plan) string { return p.epGW }, func(p plan) string { return p.endpoint }, func(p plan) string { return p.podCIDR }},
	} {
		sh(t, "ip", "link", "add", l.nodeIf, "type", "veth", "peer", "name", "eth0", "netns", l.ns.Name)
		sh(t, "ip", "link", "set", l.nodeIf, "up")
		l.ns.MustExec("ip", "link", "set", "eth0", "up")
		for _, p := range plans {
			sh(t, "ip", "addr", "add", l.nodeIP(p)+p.prefix, "dev", l.nodeIf, "nodad")
			l.ns.MustExec("ip", "addr", "add", l.nsIP(p)+p.prefix, "dev", "eth0", "nodad")
			l.ns.MustExec("ip", "route", "add", l.route(p), "via", l.nodeIP(p))
		}
	}
	for _, p := range plans {
		ln := ep.Listen(t, net.JoinHostPort(p.endpoint, strconv.Itoa(endpointPort)))
		netns.Serve(ln, func(c net.Conn) {
			fmt.Fprintf(c, "endpoint %s saw %s\n", c.LocalAddr(), c.RemoteAddr())
			c.Close()
		})
	}
	return pod
}

// fetch connects to addr from the pod namespace (pod != nil) or from the node itself (a host-network
// process) and returns the endpoint's greeting.
func fetch(ctx context.Context, pod *netns.NS, addr string) (string, error) {
	var c net.Conn
	dial := func() (err error) {
		c, err = (&net.Dialer{Timeout: dialWait}).DialContext(ctx, "tcp", addr)
		return err
	}
	var err error
	if pod != nil {
		err = pod.Do(dial)
	} else {
		err = dial()
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialWait))
	b, err := io.ReadAll(c)
	if err == nil && !strings.HasPrefix(string(b), "endpoint ") {
		err = fmt.Errorf("unexpected answer %q", b)
	}
	return strings.TrimSpace(string(b)), err
}

// ipvsServices parses /proc/net/ip_vs into "TCP 203.0.113.10:80" → real servers ("10.244.2.2:8080").
func ipvsServices(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("/proc/net/ip_vs")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 2 && (fields[0] == "TCP" || fields[0] == "UDP"):
			cur = fields[0] + " " + hexAddrPort(fields[1])
			out[cur] = nil
		case len(fields) >= 2 && fields[0] == "->" && cur != "":
			out[cur] = append(out[cur], hexAddrPort(fields[1]))
		}
	}
	return out
}

// hexAddrPort turns /proc/net/ip_vs's "CB00710A:0050" or "[2001:0db8:…:0010]:0050" into
// "203.0.113.10:80" or "[2001:db8:113::10]:80".
func hexAddrPort(s string) string {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return s
	}
	h, p := s[:i], s[i+1:]
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return s
	}
	var addr netip.Addr
	if v6, ok := strings.CutPrefix(h, "["); ok {
		addr, err = netip.ParseAddr(strings.TrimSuffix(v6, "]"))
	} else {
		var v uint64
		if v, err = strconv.ParseUint(h, 16, 32); err == nil {
			addr = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		}
	}
	if err != nil {
		return s
	}
	return netip.AddrPortFrom(addr, uint16(port)).String()
}

// ourRules returns what the agent's backend holds in the kernel: the iptables lines that name an NNM
// chain, or our nftables tables.
func ourRules(t *testing.T, backend string) string {
	t.Helper()
	if backend == "nftables" {
		var b strings.Builder
		for _, fam := range []string{"ip", "ip6", "inet"} {
			out := sh(t, "nft", "list", "tables", fam)
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) == 3 && strings.HasPrefix(f[2], "nnm-") {
					b.WriteString(sh(t, "nft", "list", "table", fam, f[2]))
				}
			}
		}
		return b.String()
	}
	var b strings.Builder
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		for _, line := range strings.Split(sh(t, save), "\n") {
			if strings.Contains(line, "NNM-") {
				b.WriteString(line + "\n")
			}
		}
	}
	return b.String()
}

// TestGuestKubeProxyIPVS reproduces, beside kube-proxy (v1.37 unless NNM_KUBE_PROXY_BIN names another) in IPVS mode on kernel 6.1, the two
// problems our IPVS-mode fixes exist for, without the agent, and shows each fixed, per backend, for
// both families:
//   - external-ip: kubernetes#75262 with real IPVS (ipvs-externalip-dnat);
//   - connection-reset: kubernetes#74839, the INVALID segment answered by an RST
//     (internal/testing/resettest; invalid-drop), since IPVS mode installs no INVALID drop of its own.
func TestGuestKubeProxyIPVS(t *testing.T) {
	requireGuest(t)
	ctx := t.Context()
	clusterIPs := strings.Split(os.Getenv("NNM_VM_CLUSTER_IPS"), ",")
	if len(clusterIPs) != len(plans) {
		t.Fatalf("NNM_VM_CLUSTER_IPS = %q, want one per family", os.Getenv("NNM_VM_CLUSTER_IPS"))
	}
	kubeconfig := os.Getenv("KUBECONFIG")
	addr := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	t.Logf("guest kernel %s", strings.TrimSpace(sh(t, "uname", "-r")))

	pod := guestTopology(t)
	reset := resettest.Extend(t, netns.Existing(t, nodeNetns), pod)
	version, err := kubeproxytest.Version()
	if err != nil {
		t.Fatal(err)
	}
	// From v1.37 IPVS mode sits behind the KubeProxyIPVS feature gate (deprecated, on by default
	// until 1.40, KEP-5495): it is set on explicitly here, and off in ipvs-gate-off below.
	var gate []string
	if kubeproxytest.MinorAtLeast(version, ipvsGateMinor) {
		gate = []string{"--feature-gates=" + ipvsGate + "=true"}
	}
	start := time.Now()
	kp := kubeproxytest.StartT(t, kubeproxytest.Options{
		Netns: nodeNetns, Kubeconfig: kubeconfig, Mode: "ipvs", NodeName: nodeName,
		ClusterCIDR: "10.244.0.0/16,fd00:10:244::/48", InitialNetns: true, Args: gate,
	})
	kp.WaitModeT(t, 4*time.Minute)
	t.Logf("kube-proxy %s %v serves /proxyMode=ipvs and synced after %v", version, gate, time.Since(start).Round(100*time.Millisecond))
	if l := agenttest.Lines(kp.LogTail(1000), ipvsDeprecated); len(l) > 0 && strings.Contains(l[0], "deprecated") {
		t.Logf("kube-proxy %s logged: %s", version, l[0])
	} else if kubeproxytest.MinorAtLeast(version, 35) {
		t.Errorf("kube-proxy %s in IPVS mode did not log its deprecation (%q ... deprecated)", version, ipvsDeprecated)
	}

	// kube-proxy's IPVS state: the LoadBalancer IPs are bound to kube-ipvs0 (not the ipMode: Proxy
	// ones), listed in its LoadBalancer-local ipsets and have virtual servers.
	// kube-proxy's /proxyMode and sync metric answer once one family synced; wait for both.
	var addrs string
	took := agenttest.Eventually(t, 2*time.Minute, func() error {
		addrs = sh(t, "ip", "addr", "show", "kube-ipvs0")
		for _, p := range plans {
			if !strings.Contains(addrs, p.lbLocal+"/") {
				return fmt.Errorf("kube-ipvs0 lacks %s:\n%s", p.lbLocal, addrs)
			}
			set := lbLocalSet(p)
			if out := sh(t, "ipset", "list", set); !strings.Contains(out, p.lbLocal+",tcp:80") {
				return fmt.Errorf("ipset %s lacks %s,tcp:80:\n%s", set, p.lbLocal, out)
			}
		}
		return nil
	})
	t.Logf("kube-proxy's IPVS state for both families after another %v", took.Round(100*time.Millisecond))

	reproduced := t.Run("without-agent/external-ip", func(t *testing.T) {
		vs := ipvsServices(t)
		t.Logf("IPVS virtual servers: %v", vs)
		for i, p := range plans {
			if !strings.Contains(addrs, p.lbLocal+"/") || strings.Contains(addrs, p.lbProxy+"/") {
				t.Fatalf("kube-ipvs0 should hold %s and not the ipMode: Proxy IP %s:\n%s", p.lbLocal, p.lbProxy, addrs)
			}
			lb, cluster := addr(p.lbLocal, servicePort), addr(clusterIPs[i], servicePort)
			if rs := vs["TCP "+cluster]; len(rs) != 1 || rs[0] != addr(p.endpoint, endpointPort) {
				t.Fatalf("want the ClusterIP virtual server %s → %s, got %v", cluster, addr(p.endpoint, endpointPort), rs)
			}
			// kubernetes#75262 as it stands in v1.35 to v1.37: kube-proxy gives the External-IP's virtual server
			// the cluster-wide endpoints when the node has no local one (kubernetes#97081), so a pod,
			// whose source address the endpoint routes back here, gets through; a host-network process
			// does not: its packets leave with the External-IP as source (the address is local, on
			// kube-ipvs0), and the endpoint's answer goes to the load balancer, not back to this node.
			if rs := vs["TCP "+lb]; len(rs) != 1 {
				t.Fatalf("want kube-proxy to give %s the remote endpoint (kubernetes#97081), got %v", lb, rs)
			}
			// The Service works by its ClusterIP (once kube-proxy has synced the family's ipsets and
			// masquerade rules too): the failure below is the External-IP path only.
			for _, from := range []*netns.NS{pod, nil} {
				var got string
				took := agenttest.Eventually(t, time.Minute, func() (err error) {
					got, err = fetch(ctx, from, cluster)
					return err
				})
				t.Logf("%s: ClusterIP %s from %s after %v: %q", p.family, cluster, who(from), took.Round(10*time.Millisecond), got)
			}
			got, err := fetch(ctx, pod, lb)
			if err != nil {
				t.Fatalf("without the agent, a pod should reach %s through IPVS (kubernetes#97081): %v", lb, err)
			}
			t.Logf("%s: without the agent: External-IP %s from a pod: %q", p.family, lb, got)
			assertUnreachable(t, nil, lb, p.family+" without the agent (kubernetes#75262)")
		}
	})
	// diagnose (#40) beside the real kube-proxy IPVS mode: the eTP Local External-IPs without a local
	// endpoint are named as a problem when ipvs-externalip-dnat is off, and also with the defaults (on
	// in IPVS mode) while no agent runs (#61: "handled" needs the running agent's last sync); with
	// the agent running, as handled (each backend below).
	t.Run("diagnose/ipvs-external-ip", func(t *testing.T) {
		for _, c := range []struct {
			args  []string
			state diagnose.State
		}{
			{[]string{"--set", "fixes.ipvs-externalip-dnat.enabled=false"}, diagnose.Problem},
			{nil, diagnose.Problem},
		} {
			f, code := diagnoseIPVS(t, kubeconfig, c.args...)
			t.Logf("diagnose %v: exit %d, %s: %s %v", c.args, code, f.State, f.Summary, f.Evidence)
			if f.State != c.state {
				t.Errorf("diagnose %v: ipvs-external-ip is %q, want %q: %s", c.args, f.State, c.state, f.Summary)
			}
			for _, p := range plans {
				if !strings.Contains(fmt.Sprint(f.Evidence), p.lbLocal) {
					t.Errorf("diagnose %v: the evidence does not name %s: %v", c.args, p.lbLocal, f.Evidence)
				}
			}
			if c.state == diagnose.Problem && code != 2 {
				t.Errorf("diagnose %v: exit status %d, want 2 (a problem no enabled fix handles)", c.args, code)
			}
		}
	})

	// kube-proxy in IPVS mode installs no INVALID drop (its iptables mode has one, in FORWARD only),
	// which is why invalid-drop is on by default here: the reset happens beside kube-proxy alone.
	reproduced = t.Run("without-agent/connection-reset", func(t *testing.T) {
		if drops := invalidDrops(t); len(drops) != 0 {
			t.Fatalf("kube-proxy IPVS mode has INVALID drop rules: %q", drops)
		}
		t.Logf("kube-proxy IPVS mode: no INVALID drop in iptables-save or ip6tables-save")
		for _, p := range resettest.Plans {
			in := resettest.Inject(t, reset, p, true)
			t.Logf("kube-proxy IPVS mode alone: %s", in)
			if err := in.Reproduced(); err != nil {
				t.Errorf("want the reset reproduced beside kube-proxy IPVS mode: %v", err)
			}
		}
	}) && reproduced
	if !reproduced {
		t.Fatal("a problem did not reproduce without the agent, so the runs with the agent would prove nothing")
	}

	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			agent := agenttest.StartT(t, agenttest.Options{Netns: nodeNetns, Args: []string{
				"--kubeconfig", kubeconfig, "--node-name", nodeName, "--backend", backend,
				"--proxy-mode", "auto", "--pod-cidrs", plans[0].podCIDR + "," + plans[1].podCIDR,
				"--families", "ipv4,ipv6", "--min-sync-period", "100ms", "--log-level", "debug",
			}})
			start := time.Now()
			agent.WaitReadyT(t, 4*time.Minute)
			t.Logf("%s: agent ready after %v", backend, time.Since(start).Round(100*time.Millisecond))
			m := scrape(t, agent)
			if info := m.Find("nnm_agent_info", "proxy_mode", "ipvs", "proxy_mode_source", "metrics-endpoint", "backend", backend); len(info) != 1 {
				t.Fatalf("nnm_agent_info should say ipvs from kube-proxy's /proxyMode with backend %s: %v", backend, m.Find("nnm_agent_info"))
			}
			ours := ourRules(t, backend)
			t.Run("diagnose", func(t *testing.T) {
				var f diagnose.Finding
				agenttest.Eventually(t, 30*time.Second, func() error {
					if f, _ = diagnoseIPVS(t, kubeconfig); f.State != diagnose.Handled {
						return fmt.Errorf("ipvs-external-ip beside the running agent: %s: %s", f.State, f.Summary)
					}
					return nil
				})
				t.Logf("diagnose beside the running agent: %s by %s: %s %v", f.State, f.HandledBy, f.Summary, f.Evidence)
			})
			t.Run("external-ip", func(t *testing.T) {
				for _, p := range plans {
					lb := addr(p.lbLocal, servicePort)
					for _, from := range []*netns.NS{pod, nil} {
						var got string
						took := agenttest.Eventually(t, 30*time.Second, func() (err error) {
							got, err = fetch(ctx, from, lb)
							return err
						})
						t.Logf("%s %s: External-IP %s from %s answered after %v: %q", backend, p.family, lb, who(from), took.Round(10*time.Millisecond), got)
					}
					assertUnreachable(t, pod, addr(p.lbLocal, servicePort+1), backend+" "+p.family+": another port of the External-IP")
					if !strings.Contains(ours, p.lbLocal) || strings.Contains(ours, p.lbProxy) {
						t.Fatalf("%s: our rules should name %s and not the ipMode: Proxy %s:\n%s", backend, p.lbLocal, p.lbProxy, ours)
					}
				}
				m := scrape(t, agent)
				t.Logf("%s: %v %v %v", backend, m.Find("nnm_fix_objects_covered", "fix", "ipvs-externalip-dnat"),
					m.Find("nnm_fix_objects_skipped", "fix", "ipvs-externalip-dnat"), m.Find("nnm_ipvs_externalip_dnat_ips"))
			})
			t.Run("connection-reset", func(t *testing.T) {
				// Our INVALID drop is in INPUT for both families: iptables chains, or nft tables (then
				// iptables holds none, as kube-proxy's IPVS mode adds none).
				drops := invalidDrops(t)
				t.Logf("%s: INVALID drops in iptables-save with the agent: %q", backend, drops)
				if want := map[string]int{"iptables": 2, "nftables": 0}[backend]; len(drops) != want {
					t.Fatalf("want %d INVALID drops in iptables-save with the %s backend, got %q", want, backend, drops)
				}
				for _, d := range drops {
					if !strings.Contains(d, "NNM-INVALID-INPUT") {
						t.Fatalf("an INVALID drop that is not ours: %q", d)
					}
				}
				for _, p := range resettest.Plans {
					in := resettest.Inject(t, reset, p, false)
					t.Logf("kube-proxy IPVS mode + agent (%s): %s", backend, in)
					if err := in.Prevented(); err != nil {
						t.Fatalf("beside kube-proxy IPVS mode with the agent (%s): %v", backend, err)
					}
					// The metric reads the kernel counters at scrape time; under emulation a read can
					// outlast its timeout (the last total is then kept), so a later scrape may be needed.
					var v float64
					took := agenttest.Eventually(t, 30*time.Second, func() (err error) {
						v, err = in.DropMetric(scrape(t, agent))
						return err
					})
					t.Logf("kube-proxy IPVS mode + agent (%s), %s: data flows both ways; nnm_invalid_drop_dropped_packets_total = %v (after %v)", backend, p.Family, v, took.Round(10*time.Millisecond))
				}
			})

			// Stop and clean up, and the problem is back: the next backend starts from scratch.
			if err := agent.Stop(agenttest.StopGrace); err != nil {
				t.Fatal(err)
			}
			bin, _ := agenttest.Binary()
			sh(t, bin, "cleanup")
			for _, p := range plans {
				assertUnreachable(t, nil, addr(p.lbLocal, servicePort), backend+" "+p.family+": after `network-node-manager cleanup`")
			}
			if drops := invalidDrops(t); len(drops) != 0 {
				t.Fatalf("INVALID drops left after `network-node-manager cleanup`: %q", drops)
			}
		})
	}

	if kubeproxytest.MinorAtLeast(version, ipvsGateMinor) {
		t.Run("ipvs-gate-off", func(t *testing.T) { ipvsGateOff(t, kp, kubeconfig, version) })
	}

	t.Run("follow/ipvs-to-nftables", func(t *testing.T) {
		followIPVSToNFTables(t, kp, kubeconfig)
	})
}

// The KubeProxyIPVS feature gate (KEP-5495): it exists from v1.37, is off by default from 1.40 and
// locked off from 1.43. kube-proxy says so whenever it starts in IPVS mode (from 1.35: "The ipvs
// proxier is now deprecated ..."; from 1.37: "The ipvs proxier has been deprecated and will be
// disabled by default in Kubernetes 1.40 ...").
const (
	ipvsGate        = "KubeProxyIPVS"
	ipvsGateMinor   = 37
	ipvsDeprecated  = "The ipvs proxier "
	ipvsGateRefusal = "must be iptables, nftables or blank"
)

// ipvsGateOff is the node of a fleet that reaches a release with KubeProxyIPVS off while its
// kube-proxy is still configured for IPVS mode: kube-proxy (restarted with the gate off) refuses to
// start, and what IPVS mode left in the kernel (kube-ipvs0, the virtual servers) stays, serving the
// Services as they were when it stopped. The agent, started then with `proxyMode: auto`, reads the
// mode from those traces (the kube-ipvs0 link) and keeps both IPVS-mode fixes: the host-network
// client reaches the External-IP through the DNAT onto the ClusterIP that the left-over virtual
// server still serves. kube-proxy is then started again as before (gate on) for the next subtest.
func ipvsGateOff(t *testing.T, kp *kubeproxytest.Proxy, kubeconfig, version string) {
	ctx := t.Context()
	kp.Stop(30 * time.Second)
	opts := kp.Options()
	opts.LogFile = filepath.Join(t.TempDir(), "kube-proxy-gate-off.log")
	opts.Args = append(slices.Clone(opts.Args), "--feature-gates="+ipvsGate+"=false")
	off, err := kubeproxytest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var exited error
	agenttest.Eventually(t, 2*time.Minute, func() error {
		if exited = off.Exited(); exited == nil {
			return errors.New("kube-proxy with the gate off is still running")
		}
		return nil
	})
	logs := off.LogTail(20)
	t.Logf("kube-proxy %s --proxy-mode=ipvs %v: exited after %v (%v); last log lines:\n%s", version, opts.Args, time.Since(start).Round(100*time.Millisecond), exited, logs)
	if !strings.Contains(logs, ipvsGateRefusal) {
		t.Errorf("kube-proxy with %s=false should refuse IPVS mode (%q)", ipvsGate, ipvsGateRefusal)
	}
	addrs := sh(t, "ip", "addr", "show", "kube-ipvs0")
	vs := ipvsServices(t)
	t.Logf("left by IPVS mode: %d virtual servers, kube-ipvs0 holds %s: %v", len(vs), plans[0].lbLocal, strings.Contains(addrs, plans[0].lbLocal+"/"))

	agent := agenttest.StartT(t, agenttest.Options{Netns: nodeNetns, Args: []string{
		"--kubeconfig", kubeconfig, "--node-name", nodeName, "--backend", "auto",
		"--proxy-mode", "auto", "--pod-cidrs", plans[0].podCIDR + "," + plans[1].podCIDR,
		"--families", "ipv4,ipv6", "--min-sync-period", "100ms", "--log-level", "debug",
	}})
	agent.WaitReadyT(t, 4*time.Minute)
	m := scrape(t, agent)
	t.Logf("the agent beside the refused kube-proxy: %v; ipvs-externalip-dnat enabled %v", m.Find("nnm_agent_info"), m.Find("nnm_fix_enabled", "fix", "ipvs-externalip-dnat"))
	if info := m.Find("nnm_agent_info", "proxy_mode", "ipvs", "proxy_mode_source", "kube-ipvs0-link"); len(info) != 1 {
		t.Errorf("want the mode read from the kube-ipvs0 link IPVS mode left: %v", m.Find("nnm_agent_info"))
	}
	for i, p := range plans {
		lb := net.JoinHostPort(p.lbLocal, strconv.Itoa(servicePort))
		var got string
		took := agenttest.Eventually(t, time.Minute, func() (err error) {
			got, err = fetch(ctx, nil, lb)
			return err
		})
		t.Logf("%s: External-IP %s from the host network, kube-proxy refused, the agent's DNAT onto %s and the left-over virtual server: %q after %v", p.family, lb, strings.Split(os.Getenv("NNM_VM_CLUSTER_IPS"), ",")[i], got, took.Round(100*time.Millisecond))
	}
	if err := agent.Stop(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	bin, _ := agenttest.Binary()
	sh(t, bin, "cleanup")

	if err := kp.Restart(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	kp.WaitModeT(t, 4*time.Minute)
}

// followSyncPeriod is the agent's syncPeriod in followIPVSToNFTables (the default).
const followSyncPeriod = 30 * time.Second

// followIPVSToNFTables (#40): kube-proxy is restarted from IPVS to nftables mode while the agent runs
// with `proxyMode: auto` and `backend: auto` (so the iptables backend beside IPVS mode, nftables
// after). Without an agent restart, ipvs-externalip-dnat is refused and its DNAT removed within one
// syncPeriod of kube-proxy answering nftables; invalid-drop moves to the nftables backend and is
// never missing from both backends, sampled every 100 ms (or as fast as the emulated guest allows)
// from before kube-proxy stops until the iptables backend is empty.
func followIPVSToNFTables(t *testing.T, kp *kubeproxytest.Proxy, kubeconfig string) {
	agent := agenttest.StartT(t, agenttest.Options{Netns: nodeNetns, Args: []string{
		"--kubeconfig", kubeconfig, "--node-name", nodeName, "--backend", "auto",
		"--proxy-mode", "auto", "--pod-cidrs", plans[0].podCIDR + "," + plans[1].podCIDR,
		"--families", "ipv4,ipv6", "--min-sync-period", "100ms", "--sync-period", followSyncPeriod.String(), "--log-level", "debug",
	}})
	agent.WaitReadyT(t, 4*time.Minute)
	pid := agent.PID()
	if info := scrape(t, agent).Find("nnm_agent_info", "proxy_mode", "ipvs", "backend", "iptables"); len(info) != 1 {
		t.Fatalf("before: nnm_agent_info should say ipvs with the iptables backend: %v", scrape(t, agent).Find("nnm_agent_info"))
	}
	agenttest.Eventually(t, time.Minute, func() error {
		for _, p := range plans {
			if !dnatHeld(p.family) {
				return fmt.Errorf("%s: no External-IP DNAT of ours in iptables yet", p.family)
			}
		}
		return nil
	})

	var g struct {
		sync.Mutex
		samples, missing, run, longest int
		first                          string
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	sampling := time.Now()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ipt, nft := invalidDropIn("iptables"), false
			if !ipt {
				nft = invalidDropIn("nftables")
			}
			g.Lock()
			g.samples++
			if ipt || nft {
				g.run = 0
			} else {
				g.missing++
				g.run++
				g.longest = max(g.longest, g.run)
				if g.first == "" {
					g.first = time.Since(sampling).String()
				}
			}
			g.Unlock()
		}
	}()

	restart := time.Now()
	kp.Stop(30 * time.Second)
	opts := kp.Options()
	opts.Mode = "nftables"
	opts.LogFile = ""
	kp2 := kubeproxytest.StartT(t, opts)
	kp2.WaitModeT(t, 4*time.Minute)
	answered := time.Since(restart)
	var refused time.Duration
	gone := agenttest.Eventually(t, followSyncPeriod, func() error {
		for _, p := range plans {
			if dnatHeld(p.family) {
				return fmt.Errorf("%s: the External-IP DNAT is still in iptables", p.family)
			}
		}
		if refused == 0 {
			refused = time.Since(restart)
		}
		return nil
	})
	took := agenttest.Eventually(t, time.Minute, func() error {
		if invalidDropIn("iptables") || !invalidDropIn("nftables") {
			return errors.New("invalid-drop not yet moved to the nftables backend")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	elapsed := time.Since(sampling)
	t.Logf("kube-proxy IPVS → nftables: /proxyMode answered nftables %v after the stop; the External-IP DNAT was gone %v after the stop (%v after the answer; syncPeriod %v); invalid-drop only in nftables %v after the stop",
		answered.Round(100*time.Millisecond), refused.Round(100*time.Millisecond), gone.Round(100*time.Millisecond), followSyncPeriod, (answered + gone + took).Round(100*time.Millisecond))
	t.Logf("invalid-drop (ipv4) through the switch: %d samples in %v (every %v on average; ticker 100 ms), %d without it in either backend, longest gap %d samples",
		g.samples, elapsed.Round(100*time.Millisecond), (elapsed / time.Duration(max(g.samples, 1))).Round(time.Millisecond), g.missing, g.longest)
	if g.longest > 0 {
		t.Errorf("invalid-drop missing from both backends for %d samples in a row (first %s after sampling began)", g.longest, g.first)
	}
	m := scrape(t, agent)
	if info := m.Find("nnm_agent_info", "proxy_mode", "nftables", "proxy_mode_source", "metrics-endpoint", "backend", "nftables"); len(info) != 1 {
		t.Errorf("after: nnm_agent_info should say nftables with the nftables backend: %v", m.Find("nnm_agent_info"))
	}
	if v, ok := m.Value("nnm_fix_refused", "fix", "ipvs-externalip-dnat"); !ok || v != 1 {
		t.Errorf("nnm_fix_refused{fix=ipvs-externalip-dnat} = %v (present %v), want 1", v, ok)
	}
	for _, want := range []string{"kube-proxy mode changed; following it", "kube-proxy's mode changed: fix refused, removing its rules"} {
		if l := agenttest.Lines(agent.Logs(), want); len(l) == 0 {
			t.Errorf("the agent log lacks %q", want)
		} else {
			t.Logf("logged: %s", l[0])
		}
	}
	if err := agent.Exited(); err != nil || agent.PID() != pid {
		t.Fatalf("the agent restarted or exited (pid %d → %d): %v", pid, agent.PID(), err)
	}
	if err := agent.Stop(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	bin, _ := agenttest.Binary()
	sh(t, bin, "cleanup")
}

// dnatHeld reports whether iptables holds our External-IP DNAT chains for family.
func dnatHeld(family string) bool {
	save := map[string]string{"ipv4": "iptables-save", "ipv6": "ip6tables-save"}[family]
	out, err := exec.Command(save, "-t", "nat").Output()
	return err == nil && strings.Contains(string(out), "-A NNM-EXTIP-")
}

// invalidDropIn reports whether the backend holds invalid-drop's IPv4 drop: our INPUT chain in
// iptables, or the fix's table in nftables. It fails nothing: the sampler calls it.
func invalidDropIn(backend string) bool {
	if backend == "nftables" {
		out, err := exec.Command("nft", "list", "table", "ip", "nnm-invalid-drop").Output()
		return err == nil && strings.Contains(string(out), "ct state invalid") && strings.Contains(string(out), "drop")
	}
	out, err := exec.Command("iptables-save", "-t", "mangle").Output()
	return err == nil && strings.Contains(string(out), "-j NNM-INVALID-INPUT") && strings.Contains(string(out), "--ctstate INVALID")
}

// scrape reads the agent's /metrics with a one-minute client timeout: under emulation a scrape
// (which reads rule counters from the kernel) can take longer than agenttest's 3-second client
// allows, again and again while a resync runs. The test runs in the node's namespace, so it dials
// the metrics address directly.
func scrape(t *testing.T, a *agenttest.Agent) agenttest.Metrics {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape the agent: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape the agent: %s, %v", resp.Status, err)
	}
	m, err := agenttest.ParseMetrics(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// invalidDrops lists the rules of both families, in every table, that drop conntrack-INVALID packets.
func invalidDrops(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out = append(out, agenttest.Lines(sh(t, save), "INVALID", "-j DROP")...)
	}
	return out
}

// lbLocalSet is kube-proxy's ipset of a family's externalTrafficPolicy: Local LoadBalancer IPs.
func lbLocalSet(p plan) string {
	return map[string]string{"ipv4": "KUBE-LOAD-BALANCER-LOCAL", "ipv6": "KUBE-6-LOAD-BALANCER-LOCAL"}[p.family]
}

func who(pod *netns.NS) string {
	if pod == nil {
		return "the node (host network)"
	}
	return "a pod"
}

// assertUnreachable fails unless addr is unreachable from each of the given places (a pod
// namespace, or nil for the node itself).
func assertUnreachable(t *testing.T, pod *netns.NS, addr, when string) {
	t.Helper()
	froms := []*netns.NS{nil}
	if pod != nil {
		froms = append(froms, pod)
	}
	for _, from := range froms {
		got, err := fetch(t.Context(), from, addr)
		if err == nil {
			t.Fatalf("%s: %s reached %s: %q", when, who(from), addr, got)
		}
		t.Logf("%s: %s cannot reach %s: %v", when, who(from), addr, err)
	}
}

// diagnoseIPVS runs `network-node-manager diagnose --output json` in the node namespace and returns
// its ipvs-external-ip finding and the exit status.
func diagnoseIPVS(t *testing.T, kubeconfig string, extra ...string) (diagnose.Finding, int) {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"netns", "exec", nodeNetns, bin, "diagnose", "--output", "json",
		"--kubeconfig", kubeconfig, "--node-name", nodeName, "--proxy-mode", "auto",
		"--pod-cidrs", plans[0].podCIDR + "," + plans[1].podCIDR, "--log-level", "warn"}, extra...)
	cmd := exec.CommandContext(t.Context(), "ip", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("diagnose: %v\n%s", err, stderr.String())
	}
	var r diagnose.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("diagnose --output json (exit %d): %v\n%s\n%s", code, err, out, stderr.String())
	}
	f := r.Find("ipvs-external-ip")
	if f == nil {
		t.Fatalf("diagnose reported no ipvs-external-ip finding:\n%s", out)
	}
	return *f, code
}
