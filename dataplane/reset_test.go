package dataplane

// Connection reset by an INVALID reply (kubernetes#74839, #117924) and the invalid-drop fix.
//
// Topology (three namespaces, created per subtest; all addresses exist only inside them):
//
//	pod  eth0 10.244.1.2/24  fd00:10:244:1::2/64   default via the node
//	 |
//	node pod0 10.244.1.1/24  fd00:10:244:1::1/64   ip_forward=1, IPv6 forwarding=1,
//	     ext0 192.0.2.1/24   2001:db8:1::1/64      masquerade of the pod prefixes out of ext0 (nft)
//	 |
//	external eth0 192.0.2.2/24  2001:db8:1::2/64   TCP server on :8080
//
// The pod client connects to the external server (the node masquerades it to 192.0.2.1:<port>) and the
// two exchange "ping"/"pong". From the external namespace the test then sends ONE segment of that
// connection through a raw socket: source server:8080, destination the masqueraded address and port,
// ACK = the server's current rcv_nxt (valid), SEQ = the server's snd_nxt + 2^30 (far beyond the window).
// The masqueraded port comes from the accepted socket, the sequence numbers from an AF_PACKET capture of
// the server's last segment.
//
// Observation only (no drop, no LOG), in a table of the test's own in the node namespace:
//   - counter invalid-from-ext: packets entering from ext0 with ct state invalid (prerouting)
//   - counter rst-to-ext:       TCP RSTs the node itself sends out of ext0 (output)
//
// plus `conntrack -S` (invalid statistic) in the node namespace and the capture on the external side.
// Without the agent `conntrack -S` rises by 2: the crafted segment, and the node's own RST, which matches
// no conntrack entry either (so it leaves un-NATed from 192.0.2.1:<port>, exactly what the server expects).
//
// Without the agent: conntrack marks the segment INVALID, so it is not de-NATed, reaches the node's own
// TCP stack, which has no socket for the port and answers with an RST whose sequence number (the
// segment's ACK) is exactly what the server expects: the server socket fails with ECONNRESET and the pod
// sees "connection reset by peer" on its next exchange.
// With the agent (invalid-drop, iptables then nftables): the segment is dropped in INPUT, no RST leaves
// the node, the connection keeps working both ways, and nnm_invalid_drop_dropped_packets_total counts it.

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/rawtcp"
	"github.com/network-node-manager/network-node-manager/internal/testenv"
)

// resetPlan is the address plan of one family.
type resetPlan struct {
	family  string // metric label: ipv4, ipv6
	server  netip.AddrPort
	nodeExt netip.Addr // the masquerade address
}

var (
	resetV4 = resetPlan{"ipv4", netip.MustParseAddrPort("192.0.2.2:8080"), netip.MustParseAddr("192.0.2.1")}
	resetV6 = resetPlan{"ipv6", netip.MustParseAddrPort("[2001:db8:1::2]:8080"), netip.MustParseAddr("2001:db8:1::1")}
)

// outOfWindow is how far beyond the server's snd_nxt the crafted segment's sequence number lies.
const outOfWindow = 1 << 30

const nodeRuleset = `
table inet nnmtest-masq {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "ext0" ip saddr 10.244.1.0/24 masquerade
		oifname "ext0" ip6 saddr fd00:10:244:1::/64 masquerade
	}
}
table inet nnmtest-observe {
	counter invalid-from-ext { }
	counter rst-to-ext { }
	chain prerouting {
		type filter hook prerouting priority 0; policy accept;
		iifname "ext0" ct state invalid counter name "invalid-from-ext"
	}
	chain output {
		type filter hook output priority 0; policy accept;
		oifname "ext0" tcp flags & rst == rst counter name "rst-to-ext"
	}
}
`

type resetTopo struct{ pod, node, ext *testenv.NS }

func newResetTopo(t *testing.T) *resetTopo {
	t.Helper()
	tp := &resetTopo{pod: newNS(t, "nnmdp-pod"), node: newNS(t, "nnmdp-node"), ext: newNS(t, "nnmdp-ext")}
	veth(tp.node, "pod0", tp.pod, "eth0")
	veth(tp.node, "ext0", tp.ext, "eth0")
	addAddrs(tp.pod, "eth0", "10.244.1.2/24", "fd00:10:244:1::2/64")
	addAddrs(tp.node, "pod0", "10.244.1.1/24", "fd00:10:244:1::1/64")
	addAddrs(tp.node, "ext0", "192.0.2.1/24", "2001:db8:1::1/64")
	addAddrs(tp.ext, "eth0", "192.0.2.2/24", "2001:db8:1::2/64")
	tp.pod.MustExec("ip", "route", "add", "default", "via", "10.244.1.1")
	tp.pod.MustExec("ip", "-6", "route", "add", "default", "via", "fd00:10:244:1::1")
	tp.node.MustExec("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	nftLoad(t, tp.node, "node", nodeRuleset)
	return tp
}

// injection is one run of the reproduction: the live connection and what was observed.
type injection struct {
	client, server net.Conn
	serverRx       <-chan chunk
	masq           netip.AddrPort
	segment        rawtcp.Segment

	invalidCT  uint64 // increase of conntrack's invalid statistic
	invalidExt uint64 // observe counter: INVALID packets from ext0
	rstSent    uint64 // observe counter: RSTs the node sent out of ext0
	rstSeen    []rawtcp.Packet
	serverErr  error // the server socket's read error after the injection, if any
}

func (in *injection) String() string {
	return fmt.Sprintf("conntrack invalid +%d, INVALID from external %d, RST sent by node %d, RST seen at external %d, server read error: %v",
		in.invalidCT, in.invalidExt, in.rstSent, len(in.rstSeen), in.serverErr)
}

// inject connects pod → external, exchanges data, sends the out-of-window segment from the external
// side and collects the observations. With expectReset it waits up to 3 s for the server socket to
// fail; otherwise it watches the server socket for 1 s.
func inject(t *testing.T, tp *resetTopo, p resetPlan, expectReset bool) *injection {
	t.Helper()
	ctx := t.Context()
	ln := listen(t, tp.ext, p.server.String())
	var capture *rawtcp.Capture
	if err := tp.ext.Do(func() (err error) { capture, err = rawtcp.NewCapture("eth0"); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Close() })

	client, err := dial(ctx, tp.pod.Path(), p.server, 3*time.Second)
	if err != nil {
		t.Fatalf("pod cannot connect to the external server %s: %v", p.server, err)
	}
	t.Cleanup(func() { client.Close() })
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
	server, err := ln.Accept()
	if err != nil {
		t.Fatalf("external server accept: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	in := &injection{client: client, server: server}
	in.masq = server.RemoteAddr().(*net.TCPAddr).AddrPort()
	in.masq = netip.AddrPortFrom(in.masq.Addr().Unmap(), in.masq.Port())
	if in.masq.Addr() != p.nodeExt {
		t.Fatalf("the server sees the client as %s, want the node's masquerade address %s", in.masq, p.nodeExt)
	}

	if _, err := client.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if err := readExactly(server, "ping\n", 3*time.Second); err != nil {
		t.Fatalf("server: %v", err)
	}
	if _, err := server.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	if err := readExactly(client, "pong\n", 3*time.Second); err != nil {
		t.Fatalf("client: %v", err)
	}

	// The server's last segment tells its snd_nxt (seq + length) and rcv_nxt (its ACK).
	fromServer := func(pk rawtcp.Packet) bool { return pk.Outgoing && pk.Src == p.server && pk.Dst == in.masq }
	if !waitFor(2*time.Second, func() bool {
		for _, pk := range capture.Filter(fromServer) {
			if string(pk.Payload) == "pong\n" {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("capture did not see the server's pong; captured:\n%s", packets(capture.Packets()))
	}
	out := capture.Filter(fromServer)
	last := out[len(out)-1]
	in.segment = rawtcp.Segment{
		Src: p.server, Dst: in.masq,
		Seq: last.SeqEnd() + outOfWindow, Ack: last.Ack,
		Flags: rawtcp.ACK | rawtcp.PSH, Window: last.Window,
		Payload: []byte("out of window\n"),
	}

	ctBefore := conntrackInvalid(t, tp.node)
	extBefore := nftCounter(t, tp.node, "inet", "nnmtest-observe", "invalid-from-ext")
	rstBefore := nftCounter(t, tp.node, "inet", "nnmtest-observe", "rst-to-ext")
	in.serverRx = readChunks(server)
	sent := time.Now()
	if err := tp.ext.Do(func() error { return rawtcp.Send(in.segment) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("last server segment: %s; injected: %s", last.Segment, in.segment)

	wait := time.Second
	if expectReset {
		wait = 3 * time.Second
	}
	select {
	case c := <-in.serverRx:
		if c.err == nil {
			t.Fatalf("the server received %q after the injection, want nothing", c.data)
		}
		in.serverErr = c.err
	case <-time.After(wait):
	}
	// A moment for packets still in flight to reach the counters and the capture.
	time.Sleep(100 * time.Millisecond)
	in.invalidCT = conntrackInvalid(t, tp.node) - ctBefore
	in.invalidExt = nftCounter(t, tp.node, "inet", "nnmtest-observe", "invalid-from-ext") - extBefore
	in.rstSent = nftCounter(t, tp.node, "inet", "nnmtest-observe", "rst-to-ext") - rstBefore
	in.rstSeen = capture.Filter(func(pk rawtcp.Packet) bool {
		return !pk.Outgoing && pk.Has(rawtcp.RST) && pk.Src == in.masq && !pk.Time.Before(sent)
	})
	return in
}

func packets(ps []rawtcp.Packet) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

func TestConnectionResetIPv4(t *testing.T) { testConnectionReset(t, resetV4) }
func TestConnectionResetIPv6(t *testing.T) { testConnectionReset(t, resetV6) }

func testConnectionReset(t *testing.T, p resetPlan) {
	require(t, "nft", "conntrack", "sysctl")

	reproduced := t.Run("without-agent", func(t *testing.T) {
		tp := newResetTopo(t)
		in := inject(t, tp, p, true)
		t.Logf("%s without agent: %s", p.family, in)
		if in.invalidExt != 1 || in.invalidCT < 1 {
			t.Errorf("conntrack did not count the crafted segment INVALID (observe counter +%d, conntrack -S invalid +%d)", in.invalidExt, in.invalidCT)
		}
		if in.rstSent != 1 || len(in.rstSeen) != 1 {
			t.Errorf("want exactly one RST from the node (sent %d, seen at external %d):\n%s", in.rstSent, len(in.rstSeen), packets(in.rstSeen))
		}
		if !isReset(in.serverErr) {
			t.Errorf("server socket error = %v, want connection reset by peer", in.serverErr)
		}
		// The pod's next exchange meets the server's RST for the socket that no longer exists.
		_, _ = in.client.Write([]byte("after\n"))
		err := readExactly(in.client, "x", 3*time.Second)
		t.Logf("%s without agent: pod client after the reset: %v", p.family, err)
		if !isReset(err) {
			t.Errorf("pod client read = %v, want connection reset by peer", err)
		}
	})
	if !reproduced {
		t.Fatal("the problem did not reproduce without the agent, so the runs with the agent would prove nothing")
	}

	for _, be := range backends {
		t.Run("with-agent/"+be, func(t *testing.T) {
			tp := newResetTopo(t)
			agent := agenttest.StartT(t, agenttest.Options{Netns: tp.node.Name, Args: []string{
				"--backend", be, "--disable-fix", "ipvs-externalip-dnat", "--log-level", "debug",
			}})
			agent.WaitReadyT(t, 20*time.Second)
			in := inject(t, tp, p, false)
			t.Logf("%s with agent (%s): %s", p.family, be, in)
			if in.invalidExt != 1 {
				t.Errorf("the crafted segment was not INVALID (observe counter +%d): the run proves nothing", in.invalidExt)
			}
			if in.rstSent != 0 || len(in.rstSeen) != 0 {
				t.Errorf("the node sent an RST (sent %d, seen at external %d):\n%s", in.rstSent, len(in.rstSeen), packets(in.rstSeen))
			}
			if in.serverErr != nil {
				t.Fatalf("server socket failed: %v", in.serverErr)
			}
			// Both directions still work.
			if _, err := in.client.Write([]byte("after\n")); err != nil {
				t.Fatalf("pod client write: %v", err)
			}
			select {
			case c := <-in.serverRx:
				if c.err != nil || c.data != "after\n" {
					t.Fatalf("server got %q, %v; want %q", c.data, c.err, "after\n")
				}
			case <-time.After(3 * time.Second):
				t.Fatal("pod → server data did not arrive")
			}
			if _, err := in.server.Write([]byte("still here\n")); err != nil {
				t.Fatalf("server write: %v", err)
			}
			if err := readExactly(in.client, "still here\n", 3*time.Second); err != nil {
				t.Fatalf("server → pod: %v", err)
			}
			v, ok := agent.MetricsT(t).Value("nnm_invalid_drop_dropped_packets_total", "family", p.family)
			t.Logf("%s with agent (%s): data both ways OK; nnm_invalid_drop_dropped_packets_total{family=%q} = %v (present %v)", p.family, be, p.family, v, ok)
			if !ok || v < 1 {
				t.Errorf("nnm_invalid_drop_dropped_packets_total{family=%q} = %v (present %v), want ≥ 1", p.family, v, ok)
			}
		})
	}
}
