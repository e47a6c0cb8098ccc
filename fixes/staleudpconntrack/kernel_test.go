package staleudpconntrack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// The kernel test reproduces kubernetes#58336 with real packets, a real kube-apiserver and the real
// engine, watch and netlink conntrack in network namespaces:
//
//	client ──veth── node ──veth── pod A
//	                     └─veth── pod B
//
// The node DNATs UDP to its hostPorts 8125 and 8126 (as the portmap plugin would): 8125 to pod A,
// 8126 to pod B. A client sends from the fixed source port 40000 to 8125, and from 40001 to 8126,
// every 200 ms. Pod A's Pod object is deleted and the 8125 DNAT rule is changed to pod B.
//
// Address plan (node n1):
//
//	         client             node (client side / pod side)     pod A                pod B
//	IPv4  192.0.2.7/24     192.0.2.1/24    10.244.1.1/32     10.244.1.10/24     10.244.1.11/24
//	IPv6  2001:db8::7/64   2001:db8::1/64  fd00:10:244:1::1  fd00:10:244:1::a/64 fd00:10:244:1::b/64
type plan struct {
	family                     rules.Family
	podCIDR                    string
	client, nodeFront, nodePod string
	podA, podB                 string
	bits, podBits              string
}

var plans = []plan{
	{rules.IPv4, "10.244.1.0/24", "192.0.2.7", "192.0.2.1", "10.244.1.1", "10.244.1.10", "10.244.1.11", "/24", "/24"},
	{rules.IPv6, "fd00:10:244:1::/64", "2001:db8::7", "2001:db8::1", "fd00:10:244:1::1", "fd00:10:244:1::a", "fd00:10:244:1::b", "/64", "/64"},
}

const (
	nodeName     = "n1"
	sendInterval = 200 * time.Millisecond
)

// receiver counts the datagrams a pod receives on one port, with the time of the first one.
type receiver struct {
	mu    sync.Mutex
	n     int
	first time.Time
}

func (r *receiver) count() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.first
}

func listenUDP(t *testing.T, ns *netns.NS, addr string, port int) *receiver {
	t.Helper()
	var c *net.UDPConn
	if err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), uint16(port))))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &receiver{}
	go func() {
		buf := make([]byte, 1500)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			r.mu.Lock()
			if r.n == 0 {
				r.first = time.Now()
			}
			r.n++
			r.mu.Unlock()
		}
	}()
	return r
}

// sendEvery sends a datagram from the fixed source port to dst every sendInterval until the test ends.
func sendEvery(t *testing.T, ns *netns.NS, src, dst netip.AddrPort) {
	t.Helper()
	var c *net.UDPConn
	if err := ns.Do(func() (err error) {
		c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(src), net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); c.Close() })
	go func() {
		tick := time.NewTicker(sendInterval)
		defer tick.Stop()
		for {
			_, _ = c.Write([]byte("metric:1|c"))
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
}

// inNS runs the real conntrack seam inside the node's network namespace.
type inNS struct {
	ns *netns.NS
	ct nodestate.Conntrack
}

func (n inNS) EachDNAT(ctx context.Context, f rules.Family, p rules.Protocol, fn func(nodestate.ConntrackEntry) bool) (err error) {
	if derr := n.ns.Do(func() error { err = n.ct.EachDNAT(ctx, f, p, fn); return nil }); derr != nil {
		return derr
	}
	return err
}

// list returns the DNAT entries of family and protocol.
func (n inNS) list(t *testing.T, f rules.Family, p rules.Protocol) []nodestate.ConntrackEntry {
	t.Helper()
	var out []nodestate.ConntrackEntry
	if err := n.EachDNAT(context.Background(), f, p, func(e nodestate.ConntrackEntry) bool { out = append(out, e); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

func (n inNS) Delete(ctx context.Context, es []nodestate.ConntrackEntry) (c int, err error) {
	if derr := n.ns.Do(func() error { c, err = n.ct.Delete(ctx, es); return nil }); derr != nil {
		return 0, derr
	}
	return c, err
}

func deletePod(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	if err := cs.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
}

// TestKernelStaleUDP: without the fix the client's packets keep going to pod A's address after A's
// Pod is deleted and the DNAT points to B; with the fix B receives within a second of the deletion,
// and the entry of the flow to the live pod B is never touched.
func TestKernelStaleUDP(t *testing.T) {
	netns.RequireKernel(t, "nft")
	cs := startCluster(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDRs: []string{plans[0].podCIDR, plans[1].podCIDR}, PodCIDR: plans[0].podCIDR}})
	for _, p := range plans {
		t.Run(string(p.family), func(t *testing.T) { testStaleUDP(t, cs, p) })
	}
}

func testStaleUDP(t *testing.T, cs kubernetes.Interface, p plan) {
	client, node, a, b := netns.New(t, "nnm-udp-cl"), netns.New(t, "nnm-udp-node"), netns.New(t, "nnm-udp-a"), netns.New(t, "nnm-udp-b")
	six := p.family == rules.IPv6
	addr := func(ns *netns.NS, cidr, dev string) {
		args := []string{"ip", "addr", "add", cidr, "dev", dev}
		if six {
			args = append(args, "nodad")
		}
		ns.MustExec(args...)
		ns.MustExec("ip", "link", "set", dev, "up")
	}
	host := "/32"
	ipf, nftf := "-4", "ip"
	if six {
		host, ipf, nftf = "/128", "-6", "ip6"
	}
	node.MustExec("ip", "link", "add", "n-cl", "type", "veth", "peer", "name", "eth0", "netns", client.Name)
	node.MustExec("ip", "link", "add", "n-a", "type", "veth", "peer", "name", "eth0", "netns", a.Name)
	node.MustExec("ip", "link", "add", "n-b", "type", "veth", "peer", "name", "eth0", "netns", b.Name)
	addr(client, p.client+p.bits, "eth0")
	addr(node, p.nodeFront+p.bits, "n-cl")
	addr(node, p.nodePod+host, "n-a")
	addr(node, p.nodePod+host, "n-b")
	node.MustExec("ip", ipf, "route", "add", p.podA+host, "dev", "n-a")
	node.MustExec("ip", ipf, "route", "add", p.podB+host, "dev", "n-b")
	for _, pod := range []struct {
		ns *netns.NS
		ip string
	}{{a, p.podA}, {b, p.podB}} {
		addr(pod.ns, pod.ip+p.podBits, "eth0")
		pod.ns.MustExec("ip", ipf, "route", "add", p.nodePod, "dev", "eth0")
		pod.ns.MustExec("ip", ipf, "route", "add", "default", "via", p.nodePod, "dev", "eth0")
	}
	client.MustExec("ip", ipf, "route", "add", "default", "via", p.nodeFront)
	node.MustExec("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding")
	dnatTo := func(target string, port int) string {
		if six {
			return fmt.Sprintf("[%s]:%d", target, port)
		}
		return fmt.Sprintf("%s:%d", target, port)
	}
	// The portmap plugin's hostPort DNAT.
	setDNAT := func(to8125 string) {
		node.MustExec("nft", fmt.Sprintf("add table %[1]s hostport; add chain %[1]s hostport pre { type nat hook prerouting priority -100; }; flush chain %[1]s hostport pre; "+
			"add rule %[1]s hostport pre udp dport 8125 dnat to %[2]s; add rule %[1]s hostport pre udp dport 8126 dnat to %[3]s",
			nftf, dnatTo(to8125, 8125), dnatTo(p.podB, 8126)))
	}
	setDNAT(p.podA)
	atA := listenUDP(t, a, p.podA, 8125)
	atB := listenUDP(t, b, p.podB, 8125)
	atB2 := listenUDP(t, b, p.podB, 8126)
	sendEvery(t, client, netip.AddrPortFrom(netip.MustParseAddr(p.client), 40000), netip.AddrPortFrom(netip.MustParseAddr(p.nodeFront), 8125))
	sendEvery(t, client, netip.AddrPortFrom(netip.MustParseAddr(p.client), 40001), netip.AddrPortFrom(netip.MustParseAddr(p.nodeFront), 8126))

	agenttest.Eventually(t, 5*time.Second, func() error {
		if n, _ := atA.count(); n == 0 {
			return errors.New("topology broken: pod A receives nothing")
		}
		return nil
	})
	real := inNS{node, nodestate.NewConntrack()}
	entryTo := func(target string, port uint16) (nodestate.ConntrackEntry, bool) {
		for _, e := range real.list(t, p.family, rules.UDP) {
			if e.Reply.Src == netip.AddrPortFrom(netip.MustParseAddr(target), port) {
				return e, true
			}
		}
		return nodestate.ConntrackEntry{}, false
	}
	// The flow to B is sent from a goroutine of its own: its first packet may come after A's.
	var toB nodestate.ConntrackEntry
	agenttest.Eventually(t, 5*time.Second, func() error {
		var ok bool
		if toB, ok = entryTo(p.podB, 8126); !ok {
			return errors.New("no conntrack entry for the flow to pod B")
		}
		return nil
	})

	// Without the fix: pod A's Pod is deleted (its entry is stale), the DNAT now points to B.
	createPodOn(t, cs, nodeName, "a-"+string(p.family), p.podA)
	createPodOn(t, cs, nodeName, "b-"+string(p.family), p.podB)
	deletePod(t, cs, "a-"+string(p.family))
	setDNAT(p.podB)
	nA0, _ := atA.count()
	time.Sleep(3 * time.Second)
	nA1, _ := atA.count()
	nB, _ := atB.count()
	t.Logf("without the fix, 3 s after the Pod deletion: pod A received %d more datagrams, pod B %d", nA1-nA0, nB)
	if nB != 0 || nA1-nA0 < 10 {
		t.Fatalf("without the fix the stale entry should keep sending to A (A got %d, B %d)", nA1-nA0, nB)
	}

	// With the fix: the real engine, watch and conntrack. Pod A is back (live) at first.
	createPodOn(t, cs, nodeName, "a-"+string(p.family), p.podA)
	c := config.Defaults()
	c.NodeName = nodeName
	c.Fixes = map[string]map[string]any{ID: {"enabled": true}}
	// A deletion arrives as two events (deletionTimestamp set, then the object gone); the engine
	// coalesces the second behind the first for up to minSyncPeriod, which bounds the reaction time
	// (the default 1s measured 1.03-1.09 s here). The proof runs with 200ms.
	c.MinSyncPeriod = 200 * time.Millisecond
	e, _, reg := runEngine(t, cs, &c, real)
	// A live target survives: the fix runs, A's Pod exists, A keeps receiving.
	agenttest.Until(t, 5*time.Second, func() bool { return e.Ready() == nil })
	nA0, _ = atA.count()
	time.Sleep(time.Second)
	if nA1, _ = atA.count(); nA1-nA0 < 3 {
		t.Fatalf("with A's Pod live the fix must leave its entry: A got %d datagrams in 1 s", nA1-nA0)
	}
	deletePod(t, cs, "a-"+string(p.family))
	deleted := time.Now()
	agenttest.Eventually(t, 5*time.Second, func() error {
		if n, _ := atB.count(); n == 0 {
			return errors.New("with the fix pod B never received the client's datagrams")
		}
		return nil
	})
	_, first := atB.count()
	took := first.Sub(deleted)
	nA2, _ := atA.count()
	time.Sleep(time.Second)
	nA3, _ := atA.count()
	t.Logf("with the fix: pod B received its first datagram %v after the Pod deletion; pod A received %d in the following second", took.Round(time.Millisecond), nA3-nA2)
	if took > time.Second {
		t.Errorf("B received %v after the deletion, want within 1 s", took)
	}
	if nA3 != nA2 {
		t.Errorf("pod A still receives after the fix (%d datagrams)", nA3-nA2)
	}
	// The flow to the live pod B kept its entry (same kernel id) and its datagrams.
	if still, ok := entryTo(p.podB, 8126); !ok || still.ID != toB.ID {
		t.Errorf("the entry to the live pod B was deleted or replaced (was id %d, now %+v, %v)", toB.ID, still, ok)
	}
	if n, _ := atB2.count(); n < 15 {
		t.Errorf("the flow to the live pod B got only %d datagrams", n)
	}
	if got, _ := testkit.Value(t, reg, "nnm_stale_udp_conntrack_deleted_entries_total", "family", string(p.family)); got < 1 {
		t.Errorf("deleted_entries_total{family=%s} = %v", p.family, got)
	}
	deletePod(t, cs, "b-"+string(p.family))
}
