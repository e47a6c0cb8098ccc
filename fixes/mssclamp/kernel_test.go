package mssclamp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/rawtcp"
)

// The kernel test builds a path-MTU black hole in four network namespaces and downloads through it:
//
//	pod ──1500── node ──1400── router ──1500── server
//
// The router drops the ICMP "fragmentation needed" / "packet too big" it would send back, so a server
// that believes the pod's MSS (1460 / 1440) sends segments that never cross the 1400-byte link and the
// download stalls. The node runs the fix's rules (each backend in turn); the node's route towards the
// server has the 1400-byte MTU, so the path-MTU clamp lowers the MSS to 1360 (IPv4) / 1340 (IPv6).
//
// Address plan:
//
//	            pod                    node (pod side / uplink)          router (down / up)             server
//	IPv4  10.244.1.2/24        10.244.1.1   192.0.2.1/24         192.0.2.2   198.51.100.1/24     198.51.100.2/24
//	IPv6  fd00:10:244:1::2/64  fd00:10:244:1::1  2001:db8:1::1/64 2001:db8:1::2 2001:db8:2::1/64  2001:db8:2::2/64
type plan struct {
	family                               rules.Family
	podCIDR                              string
	pod, podGW                           string
	nodeUp, routerDown, routerUp, server string
	bits                                 string // prefix length of the links
	headers                              int    // IP + TCP header bytes: MSS = MTU - headers
}

var plans = []plan{
	{rules.IPv4, "10.244.1.0/24", "10.244.1.2", "10.244.1.1", "192.0.2.1", "192.0.2.2", "198.51.100.1", "198.51.100.2", "/24", 40},
	{rules.IPv6, "fd00:10:244:1::/64", "fd00:10:244:1::2", "fd00:10:244:1::1", "2001:db8:1::1", "2001:db8:1::2", "2001:db8:2::1", "2001:db8:2::2", "/64", 60},
}

const (
	narrowMTU = 1400
	wideMTU   = 1500
	download  = 1 << 20 // bytes
	// stallWait is how long a download without the fix gets before it counts as stalled; a working
	// one takes milliseconds here.
	stallWait = 3 * time.Second
	okWait    = 20 * time.Second
)

type lab struct {
	p                         plan
	pod, node, router, server *netns.NS
}

func newLab(t *testing.T, p plan) *lab {
	t.Helper()
	l := &lab{p: p, pod: netns.New(t, "nnm-mss-pod"), node: netns.New(t, "nnm-mss-node"), router: netns.New(t, "nnm-mss-rt"), server: netns.New(t, "nnm-mss-srv")}
	addr := func(ns *netns.NS, a, dev string) {
		args := []string{"ip", "addr", "add", a, "dev", dev}
		if p.family == rules.IPv6 {
			args = append(args, "nodad")
		}
		ns.MustExec(args...)
		ns.MustExec("ip", "link", "set", dev, "up")
	}
	l.node.MustExec("ip", "link", "add", "n-pod", "type", "veth", "peer", "name", "eth0", "netns", l.pod.Name)
	l.node.MustExec("ip", "link", "add", "n-up", "mtu", fmt.Sprint(narrowMTU), "type", "veth", "peer", "name", "r-down", "mtu", fmt.Sprint(narrowMTU), "netns", l.router.Name)
	l.router.MustExec("ip", "link", "add", "r-up", "type", "veth", "peer", "name", "eth0", "netns", l.server.Name)
	podBits := p.podCIDR[strings.Index(p.podCIDR, "/"):]
	addr(l.pod, p.pod+podBits, "eth0")
	addr(l.node, p.podGW+podBits, "n-pod")
	addr(l.node, p.nodeUp+p.bits, "n-up")
	addr(l.router, p.routerDown+p.bits, "r-down")
	addr(l.router, p.routerUp+p.bits, "r-up")
	addr(l.server, p.server+p.bits, "eth0")
	ipf := "-4"
	if p.family == rules.IPv6 {
		ipf = "-6"
	}
	l.pod.MustExec("ip", ipf, "route", "add", "default", "via", p.podGW)
	l.node.MustExec("ip", ipf, "route", "add", "default", "via", p.routerDown)
	l.router.MustExec("ip", ipf, "route", "add", p.podCIDR, "via", p.nodeUp)
	l.server.MustExec("ip", ipf, "route", "add", "default", "via", p.routerUp)
	for _, ns := range []*netns.NS{l.node, l.router} {
		ns.MustExec("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding")
	}
	// The black hole: the router never tells the server that its segments are too big.
	l.router.MustExec("nft", "add table inet lab; add chain inet lab out { type filter hook output priority 0; policy accept; }; "+
		"add rule inet lab out icmp type destination-unreachable icmp code frag-needed counter drop; "+
		"add rule inet lab out icmpv6 type packet-too-big counter drop")
	return l
}

// result is one transfer: the bytes the client read before EOF or the deadline, the time it took,
// and the MSS of the SYN and SYN-ACK as the pod and the server saw them (0: not seen).
type result struct {
	n                       int64
	took                    time.Duration
	podSYN, podSYNACK       uint16
	serverSYN, serverSYNACK uint16
}

func (r result) String() string {
	return fmt.Sprintf("%d of %d bytes in %v; MSS at the pod: SYN %d, SYN-ACK %d; at the server: SYN %d, SYN-ACK %d",
		r.n, download, r.took.Round(time.Millisecond), r.podSYN, r.podSYNACK, r.serverSYN, r.serverSYNACK)
}

// transfer makes a TCP connection from the client namespace (the pod or the server) to a listener
// opened in the other one, which writes size bytes and closes. Fresh captures on the pod's and the
// server's interface record the handshake (a capture that just saw a megabyte may still be
// draining its socket buffer and miss the next handshake).
func (l *lab) transfer(t *testing.T, fromPod bool, size int, wait time.Duration) result {
	t.Helper()
	client, sender, listenAddr := l.pod, l.server, l.p.server
	if !fromPod {
		client, sender, listenAddr = l.server, l.pod, l.p.pod
	}
	var podCap, serverCap *rawtcp.Capture
	if err := l.pod.Do(func() (err error) { podCap, err = rawtcp.NewCapture("eth0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer podCap.Close()
	if err := l.server.Do(func() (err error) { serverCap, err = rawtcp.NewCapture("eth0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer serverCap.Close()
	ln, err := listen(sender, listenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(wait))
		_, _ = c.Write(make([]byte, size))
	}()
	var c net.Conn
	if err := client.Do(func() (err error) { c, err = net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second); return err }); err != nil {
		t.Fatalf("connect %s: %v (the handshake must work even without the fix)", ln.Addr(), err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(wait))
	var r result
	r.n, _ = io.Copy(io.Discard, c)
	r.took = time.Since(start)
	port := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
	r.podSYN, r.podSYNACK = handshakeMSS(podCap, port)
	r.serverSYN, r.serverSYNACK = handshakeMSS(serverCap, port)
	return r
}

// waitReachable waits until the pod can open a connection to the server.
func waitReachable(t *testing.T, l *lab) {
	t.Helper()
	ln, err := listen(l.server, l.p.server)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	netns.AcceptAndClose(ln)
	if err := netns.ConnectWithin(t, l.pod, ln.Addr().String(), 15*time.Second); err != nil {
		t.Fatalf("the pod cannot reach the server: %v", err)
	}
}

func listen(ns *netns.NS, addr string) (ln net.Listener, err error) {
	err = ns.Do(func() error { ln, err = net.Listen("tcp", net.JoinHostPort(addr, "0")); return err })
	return ln, err
}

// handshakeMSS returns the MSS of the SYN and of the SYN-ACK of the connection with client port
// port, as seen by a capture (0 when not captured). The capture reads in the background, so it
// waits up to a second for both to show up.
func handshakeMSS(c *rawtcp.Capture, port uint16) (syn, synAck uint16) {
	_ = agenttest.Poll(context.Background(), time.Second, 10*time.Millisecond, func() error {
		if syn, synAck = seenMSS(c, port); syn == 0 || synAck == 0 {
			return errors.New("handshake not captured yet")
		}
		return nil
	})
	return syn, synAck
}

func seenMSS(c *rawtcp.Capture, port uint16) (syn, synAck uint16) {
	for _, p := range c.Packets() {
		switch {
		case p.Flags&(rawtcp.SYN|rawtcp.ACK) == rawtcp.SYN && p.Src.Port() == port:
			syn = p.MSS
		case p.Flags&(rawtcp.SYN|rawtcp.ACK) == rawtcp.SYN|rawtcp.ACK && p.Dst.Port() == port:
			synAck = p.MSS
		}
	}
	return syn, synAck
}

// TestKernelBlackHole: without the fix a 1 MB download from the server stalls; with the fix's
// rules applied by each backend it completes, and the captures show the clamped MSS in the SYN of a
// pod-initiated connection and in the SYN-ACK of a server-initiated one (one direction is not enough:
// Submariner #1488). A fixed MSS is applied to SYN and SYN-ACK alike and never raises an MSS.
func TestKernelBlackHole(t *testing.T) {
	netns.RequireKernel(t, "iptables-restore", "ip6tables-restore", "nft")
	for _, p := range plans {
		t.Run(string(p.family), func(t *testing.T) {
			t.Parallel() // each family has a lab of its own; most of the time is the stall waits
			testBlackHole(t, p)
		})
	}
}

func testBlackHole(t *testing.T, p plan) {
	ctx := context.Background()
	l := newLab(t, p)
	wideMSS := uint16(wideMTU - p.headers)
	clamped := uint16(narrowMTU - p.headers)

	// The path works for small transfers (IPv6 needs a moment for neighbour discovery)...
	waitReachable(t, l)
	if r := l.transfer(t, true, 1000, okWait); r.n != 1000 {
		t.Fatalf("topology broken: a 1000-byte transfer delivered %d bytes", r.n)
	}
	// ...and is a black hole for large ones without the fix.
	r := l.transfer(t, true, download, stallWait)
	t.Logf("without the fix, pod downloads: %s", r)
	if r.n >= download {
		t.Fatalf("without the fix the download completed: the lab has no black hole")
	}
	if r.serverSYN != wideMSS {
		t.Fatalf("without the fix the server saw MSS %d in the SYN, want %d", r.serverSYN, wideMSS)
	}
	icmp := "frag-needed"
	if p.family == rules.IPv6 {
		icmp = "packet-too-big"
	}
	for _, line := range strings.Split(l.router.MustExec("nft", "list", "chain", "inet", "lab", "out"), "\n") {
		if strings.Contains(line, icmp) && strings.Contains(line, "packets 0 ") {
			t.Fatalf("the router dropped no ICMP %s, so the stall has another cause: %s", icmp, line)
		}
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	snap := testkit.Snapshot(testkit.WithPodCIDRs(p.podCIDR))
	for _, name := range backends.Names {
		t.Run(name, func(t *testing.T) {
			be, err := backends.New(name, "nft", log)
			if err != nil {
				t.Fatal(err)
			}
			f, err := New(fix.Params{Backend: be})
			if err != nil {
				t.Fatal(err)
			}
			apply := func(options map[string]any) {
				t.Helper()
				if err := f.Configure(options); err != nil {
					t.Fatal(err)
				}
				rs, _, err := f.Rules(snap, p.family)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.node.Do(func() error { return testkit.Apply(ctx, be, rs) }); err != nil {
					t.Fatal(err)
				}
			}

			// Path-MTU clamp (the default): the pod's SYN reaches the server clamped.
			apply(map[string]any{})
			r := l.transfer(t, true, download, okWait)
			t.Logf("with the fix (path MTU), pod downloads: %s", r)
			if r.n != download {
				t.Errorf("with the fix the download delivered %d of %d bytes in %v", r.n, download, r.took)
			}
			if r.podSYN != wideMSS || r.serverSYN != clamped {
				t.Errorf("the pod's SYN left with MSS %d and reached the server with %d, want %d and %d (the route's MTU %d minus %d)", r.podSYN, r.serverSYN, wideMSS, clamped, narrowMTU, p.headers)
			}
			// The other direction: the server connects to the pod, and the pod's SYN-ACK is clamped.
			r = l.transfer(t, false, download, okWait)
			t.Logf("with the fix (path MTU), server downloads from the pod: %s", r)
			if r.n != download {
				t.Errorf("server-initiated transfer delivered %d of %d bytes", r.n, download)
			}
			if r.podSYNACK != wideMSS || r.serverSYNACK != clamped {
				t.Errorf("the pod's SYN-ACK left with MSS %d and reached the server with %d, want %d and %d", r.podSYNACK, r.serverSYNACK, wideMSS, clamped)
			}
			var cs map[string]backend.Counter
			if err := l.node.Do(func() (err error) { cs, err = be.Counters(ctx, ID, p.family); return err }); err != nil {
				t.Fatal(err)
			}
			if cs[CounterFromPods].Packets == 0 || cs[CounterToPods].Packets == 0 {
				t.Errorf("clamp counters %+v: both directions should have counted SYNs", cs)
			}

			// A fixed MSS lowers the SYN and the SYN-ACK of one connection alike...
			apply(map[string]any{"mss": 1300})
			r = l.transfer(t, true, download, okWait)
			t.Logf("with the fix (mss 1300), pod downloads: %s", r)
			if r.n != download || r.serverSYN != 1300 || r.serverSYNACK != wideMSS || r.podSYNACK != 1300 {
				t.Errorf("mss 1300: want all %d bytes, the SYN at the server and the SYN-ACK at the pod at 1300, the server's own SYN-ACK at %d", download, wideMSS)
			}
			// ...and never raises one.
			apply(map[string]any{"mss": 9000})
			r = l.transfer(t, true, 1000, okWait)
			t.Logf("with the fix (mss 9000), pod downloads 1000 bytes: %s", r)
			if r.serverSYN != wideMSS || r.podSYNACK != wideMSS {
				t.Errorf("mss 9000: the server saw MSS %d in the SYN and the pod %d in the SYN-ACK, want both unchanged at %d", r.serverSYN, r.podSYNACK, wideMSS)
			}

			// Removing the rules brings the black hole back.
			if err := l.node.Do(func() error { return testkit.Remove(ctx, be, ID, p.family) }); err != nil {
				t.Fatal(err)
			}
			r = l.transfer(t, true, download, stallWait)
			t.Logf("after Remove, pod downloads: %s", r)
			if r.n >= download || r.serverSYN != wideMSS {
				t.Errorf("after Remove: want a stall and MSS %d in the SYN at the server", wideMSS)
			}
		})
	}
}
