// Package resettest is the connection-reset reproduction (kubernetes#74839, #117924) that the
// invalid-drop fix prevents, shared by the lanes that run it: dataplane/reset_test.go (bare node),
// dataplane/kubeproxy_test.go (beside kube-proxy's iptables and nftables modes, host kernel) and
// e2e/vm (beside kube-proxy's IPVS mode, kernel 6.1 in a VM).
//
// Topology (all addresses exist only in the test's namespaces, or in the VM):
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
// sees "connection reset by peer" on its next exchange (Injection.Reproduced).
// With the agent (invalid-drop): the segment is dropped in INPUT, no RST leaves the node, and the
// connection keeps working both ways (Injection.Prevented).
package resettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/rawtcp"
)

// Plan is the address plan of one family; IPv4 and IPv6 differ only here.
type Plan struct {
	Family  string       // metric label: ipv4, ipv6
	PodCIDR netip.Prefix // the pod link's prefix, masqueraded out of ext0; the node is .1, the pod .2
	Server  netip.AddrPort
	NodeExt netip.Addr // the masquerade address, on ext0
}

var (
	V4 = Plan{"ipv4", netip.MustParsePrefix("10.244.1.0/24"), netip.MustParseAddrPort("192.0.2.2:8080"), netip.MustParseAddr("192.0.2.1")}
	V6 = Plan{"ipv6", netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParseAddrPort("[2001:db8:1::2]:8080"), netip.MustParseAddr("2001:db8:1::1")}
	// Plans are both families, IPv4 first.
	Plans = []Plan{V4, V6}
)

// NftFamily is the plan's nft table family: ip or ip6.
func (p Plan) NftFamily() string { return map[bool]string{true: "ip", false: "ip6"}[p.NodeExt.Is4()] }

// IPTablesSave is the plan's iptables-save binary: iptables-save or ip6tables-save.
func (p Plan) IPTablesSave() string {
	return map[bool]string{true: "iptables-save", false: "ip6tables-save"}[p.NodeExt.Is4()]
}

// PodGW is the node's address on the pod link, PodIP the pod's.
func (p Plan) PodGW() netip.Addr { return p.PodCIDR.Addr().Next() }
func (p Plan) PodIP() netip.Addr { return p.PodGW().Next() }

func (p Plan) prefix(a netip.Addr) string { return netip.PrefixFrom(a, p.PodCIDR.Bits()).String() }

// extCIDR is addr with the external link's prefix length (the server's /24 or /64).
func (p Plan) extCIDR(a netip.Addr) string {
	return netip.PrefixFrom(a, map[bool]int{true: 24, false: 64}[p.NodeExt.Is4()]).String()
}

// OutOfWindow is how far beyond the server's snd_nxt the crafted segment's sequence number lies.
const OutOfWindow = 1 << 30

// Names of the node's links and of the test's nft tables there.
const (
	PodLink      = "pod0"
	extLink      = "ext0"
	observeTable = "nnmtest-observe"
)

// nodeRuleset masquerades the pods out of ext0 and counts what the reproduction observes.
func nodeRuleset() string {
	var masq strings.Builder
	for _, p := range Plans {
		fmt.Fprintf(&masq, "\t\toifname %q %s saddr %s masquerade\n", extLink, p.NftFamily(), p.PodCIDR)
	}
	return `
table inet nnmtest-masq {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
` + masq.String() + `	}
}
table inet ` + observeTable + ` {
	counter invalid-from-ext { }
	counter rst-to-ext { }
	chain prerouting {
		type filter hook prerouting priority 0; policy accept;
		iifname "` + extLink + `" ct state invalid counter name "invalid-from-ext"
	}
	chain output {
		type filter hook output priority 0; policy accept;
		oifname "` + extLink + `" tcp flags & rst == rst counter name "rst-to-ext"
	}
}
`
}

// Topo is the reproduction's three namespaces.
type Topo struct{ Pod, Node, Ext *netns.NS }

// New creates the pod, node and external namespaces (all deleted when t ends) and links them.
func New(t *testing.T) *Topo {
	t.Helper()
	pod, node := netns.NewNoDAD(t, "nnmdp-pod"), netns.NewNoDAD(t, "nnmdp-node")
	node.Veth(PodLink, pod, "eth0")
	for _, p := range Plans {
		pod.AddAddrs("eth0", p.prefix(p.PodIP()))
		node.AddAddrs(PodLink, p.prefix(p.PodGW()))
		pod.MustExec("ip", "route", "add", "default", "via", p.PodGW().String())
	}
	return Extend(t, node, pod)
}

// Extend adds the external namespace to a node and a pod that the caller linked as New does (the
// node's PodLink holds each Plan's PodGW, the pod has PodIP and a default route via it): the e2e/vm
// guest, whose node is the VM's own namespace.
func Extend(t *testing.T, node, pod *netns.NS) *Topo {
	t.Helper()
	tp := &Topo{Pod: pod, Node: node, Ext: netns.NewNoDAD(t, "nnmdp-ext")}
	node.Veth(extLink, tp.Ext, "eth0")
	for _, p := range Plans {
		node.AddAddrs(extLink, p.extCIDR(p.NodeExt))
		tp.Ext.AddAddrs("eth0", p.extCIDR(p.Server.Addr()))
	}
	node.MustExec("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	node.NftLoad(nodeRuleset())
	return tp
}

// chunk is one read of a connection, or its final error.
type chunk struct {
	data string
	err  error
}

// readChunks reads from c in the background; each read (or the final error) arrives on the channel.
func readChunks(c net.Conn) <-chan chunk {
	ch := make(chan chunk, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				ch <- chunk{data: string(buf[:n])}
			}
			if err != nil {
				ch <- chunk{err: err}
				return
			}
		}
	}()
	return ch
}

// Injection is one run of the reproduction: the live connection and what was observed.
type Injection struct {
	Plan           Plan
	Client, Server net.Conn
	serverRx       <-chan chunk
	Masq           netip.AddrPort
	Segment        rawtcp.Segment

	InvalidCT  uint64 // increase of conntrack's invalid statistic
	InvalidExt uint64 // observe counter: INVALID packets from ext0
	RSTSent    uint64 // observe counter: RSTs the node sent out of ext0
	RSTSeen    []rawtcp.Packet
	ServerErr  error // the server socket's read error after the injection, if any
}

func (in *Injection) String() string {
	return fmt.Sprintf("%s: conntrack invalid +%d, INVALID from external %d, RST sent by node %d, RST seen at external %d, server read error: %v",
		in.Plan.Family, in.InvalidCT, in.InvalidExt, in.RSTSent, len(in.RSTSeen), in.ServerErr)
}

// Inject connects pod → external, exchanges data, sends the out-of-window segment from the external
// side and collects the observations. With expectReset it waits up to 3 s for the server socket to
// fail; otherwise it watches the server socket for 1 s.
func Inject(t *testing.T, tp *Topo, p Plan, expectReset bool) *Injection {
	t.Helper()
	ctx := t.Context()
	ln := tp.Ext.Listen(t, p.Server.String())
	var capture *rawtcp.Capture
	if err := tp.Ext.Do(func() (err error) { capture, err = rawtcp.NewCapture("eth0"); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Close() })

	client, err := netns.DialContext(tp.Pod.Path(), &net.Dialer{Timeout: 3 * time.Second})(ctx, "tcp", p.Server.String())
	if err != nil {
		t.Fatalf("pod cannot connect to the external server %s: %v", p.Server, err)
	}
	t.Cleanup(func() { client.Close() })
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
	server, err := ln.Accept()
	if err != nil {
		t.Fatalf("external server accept: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	in := &Injection{Plan: p, Client: client, Server: server}
	in.Masq = server.RemoteAddr().(*net.TCPAddr).AddrPort()
	in.Masq = netip.AddrPortFrom(in.Masq.Addr().Unmap(), in.Masq.Port())
	if in.Masq.Addr() != p.NodeExt {
		t.Fatalf("the server sees the client as %s, want the node's masquerade address %s", in.Masq, p.NodeExt)
	}

	if _, err := client.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if err := ReadExactly(server, "ping\n", 3*time.Second); err != nil {
		t.Fatalf("server: %v", err)
	}
	if _, err := server.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	if err := ReadExactly(client, "pong\n", 3*time.Second); err != nil {
		t.Fatalf("client: %v", err)
	}

	last, seg, err := CraftAfterPong(ctx, capture, p.Server, in.Masq)
	if err != nil {
		t.Fatal(err)
	}
	in.Segment = seg

	ctBefore := conntrackInvalid(t, tp.Node)
	extBefore := nftCounter(t, tp.Node, "invalid-from-ext")
	rstBefore := nftCounter(t, tp.Node, "rst-to-ext")
	in.serverRx = readChunks(server)
	sent := time.Now()
	if err := tp.Ext.Do(func() error { return rawtcp.Send(in.Segment) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: last server segment: %s; injected: %s", p.Family, last.Segment, in.Segment)

	wait := time.Second
	if expectReset {
		wait = 3 * time.Second
	}
	select {
	case c := <-in.serverRx:
		if c.err == nil {
			t.Fatalf("the server received %q after the injection, want nothing", c.data)
		}
		in.ServerErr = c.err
	case <-time.After(wait):
	}
	// A moment for packets still in flight to reach the counters and the capture.
	time.Sleep(100 * time.Millisecond)
	in.InvalidCT = conntrackInvalid(t, tp.Node) - ctBefore
	in.InvalidExt = nftCounter(t, tp.Node, "invalid-from-ext") - extBefore
	in.RSTSent = nftCounter(t, tp.Node, "rst-to-ext") - rstBefore
	in.RSTSeen = capture.Filter(func(pk rawtcp.Packet) bool {
		return !pk.Outgoing && pk.Has(rawtcp.RST) && pk.Src == in.Masq && !pk.Time.Before(sent)
	})
	return in
}

// CraftAfterPong waits until capture (on the server's link) saw the server's "pong\n" to masq and
// returns the server's last segment and the out-of-window segment made from it: its snd_nxt (seq +
// length) plus OutOfWindow, and its rcv_nxt (its ACK). The cluster lane (e2e/cluster) uses it too.
func CraftAfterPong(ctx context.Context, capture *rawtcp.Capture, server, masq netip.AddrPort) (rawtcp.Packet, rawtcp.Segment, error) {
	fromServer := func(pk rawtcp.Packet) bool { return pk.Outgoing && pk.Src == server && pk.Dst == masq }
	if err := agenttest.Poll(ctx, 2*time.Second, 20*time.Millisecond, func() error {
		for _, pk := range capture.Filter(fromServer) {
			if string(pk.Payload) == "pong\n" {
				return nil
			}
		}
		return errors.New("no pong from the server yet")
	}); err != nil {
		return rawtcp.Packet{}, rawtcp.Segment{}, fmt.Errorf("capture did not see the server's pong (%v); captured:\n%s", err, Packets(capture.Packets()))
	}
	out := capture.Filter(fromServer)
	last := out[len(out)-1]
	return last, rawtcp.Segment{
		Src: server, Dst: masq,
		Seq: last.SeqEnd() + OutOfWindow, Ack: last.Ack,
		Flags: rawtcp.ACK | rawtcp.PSH, Window: last.Window,
		Payload: []byte("out of window\n"),
	}, nil
}

// Reproduced checks the problem: the segment was INVALID, the node answered it with exactly one RST,
// the server socket was reset, and the pod's next exchange meets "connection reset by peer".
func (in *Injection) Reproduced() error {
	var errs []error
	if in.InvalidExt != 1 || in.InvalidCT < 1 {
		errs = append(errs, fmt.Errorf("conntrack did not count the crafted segment INVALID (observe counter +%d, conntrack -S invalid +%d)", in.InvalidExt, in.InvalidCT))
	}
	if in.RSTSent != 1 || len(in.RSTSeen) != 1 {
		errs = append(errs, fmt.Errorf("want exactly one RST from the node (sent %d, seen at external %d):\n%s", in.RSTSent, len(in.RSTSeen), Packets(in.RSTSeen)))
	}
	if !IsReset(in.ServerErr) {
		errs = append(errs, fmt.Errorf("server socket error = %v, want connection reset by peer", in.ServerErr))
	}
	// The pod's next exchange meets the server's RST for the socket that no longer exists.
	_, _ = in.Client.Write([]byte("after\n"))
	if err := ReadExactly(in.Client, "x", 3*time.Second); !IsReset(err) {
		errs = append(errs, fmt.Errorf("pod client read after the reset = %v, want connection reset by peer", err))
	}
	return errors.Join(errs...)
}

// Prevented checks the fix: the segment was INVALID (else the run proves nothing), no RST left the
// node, the server socket is fine, and data still flows both ways.
func (in *Injection) Prevented() error {
	if in.InvalidExt != 1 {
		return fmt.Errorf("the crafted segment was not INVALID (observe counter +%d): the run proves nothing", in.InvalidExt)
	}
	if in.RSTSent != 0 || len(in.RSTSeen) != 0 || in.ServerErr != nil {
		return fmt.Errorf("the connection was reset: %s\n%s", in, Packets(in.RSTSeen))
	}
	if _, err := in.Client.Write([]byte("after\n")); err != nil {
		return fmt.Errorf("pod client write: %w", err)
	}
	select {
	case c := <-in.serverRx:
		if c.err != nil || c.data != "after\n" {
			return fmt.Errorf("server got %q, %v; want %q", c.data, c.err, "after\n")
		}
	case <-time.After(3 * time.Second):
		return errors.New("pod → server data did not arrive")
	}
	if _, err := in.Server.Write([]byte("still here\n")); err != nil {
		return fmt.Errorf("server write: %w", err)
	}
	if err := ReadExactly(in.Client, "still here\n", 3*time.Second); err != nil {
		return fmt.Errorf("server → pod: %w", err)
	}
	return nil
}

// DropMetric is the agent's count of dropped INVALID packets of the injection's family; an error
// unless it counted at least one.
func (in *Injection) DropMetric(m agenttest.Metrics) (float64, error) {
	const name = "nnm_invalid_drop_dropped_packets_total"
	v, ok := m.Value(name, "family", in.Plan.Family)
	if !ok || v < 1 {
		return v, fmt.Errorf("%s{family=%q} = %v (present %v), want ≥ 1", name, in.Plan.Family, v, ok)
	}
	return v, nil
}

// Packets lists packets one a line.
func Packets(ps []rawtcp.Packet) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

// ReadExactly reads len(want) bytes with a deadline and compares them.
func ReadExactly(c net.Conn, want string, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read %q: %w", want, err)
	}
	if string(buf) != want {
		return fmt.Errorf("read %q, want %q", buf, want)
	}
	return nil
}

// IsReset reports whether err is "connection reset by peer".
func IsReset(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "connection reset by peer"))
}

var packetsRE = regexp.MustCompile(`packets (\d+)`)

// nftCounter reads a named counter of the observation table.
func nftCounter(t *testing.T, ns *netns.NS, name string) uint64 {
	t.Helper()
	out := ns.MustExec("nft", "list", "counter", "inet", observeTable, name)
	m := packetsRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no packet count in `nft list counter inet %s %s`:\n%s", observeTable, name, out)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

var invalidRE = regexp.MustCompile(`\binvalid=(\d+)`)

// conntrackInvalid sums conntrack's per-CPU "invalid" statistic of the namespace (`conntrack -S`).
func conntrackInvalid(t *testing.T, ns *netns.NS) uint64 {
	t.Helper()
	out := ns.MustExec("conntrack", "-S")
	var total uint64
	found := false
	for _, m := range invalidRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		total += n
		found = true
	}
	if !found {
		t.Fatalf("no invalid= field in `conntrack -S`:\n%s", out)
	}
	return total
}
