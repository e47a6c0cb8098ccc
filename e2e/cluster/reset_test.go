package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/rawtcp"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// kubernetes#74839 with a real Pod: client-a on node-a connects to a server outside the cluster
// network (a namespace of the test on the bridge, extIP), through node-a's masquerade (the CNI bridge
// plugin's ipMasq). The test's server then sends one segment of that connection far beyond the
// window, as internal/testing/resettest does: without the agent node-a's conntrack marks it INVALID, does not
// de-NAT it, and node-a's own TCP stack answers with an RST that resets the server's socket; with the
// agent (invalid-drop) the segment is dropped and the connection lives on.

const (
	extIP      = "192.168.100.50"
	resetWait  = "8s" // the client's pause between "pong" and "after": the injection happens in it
	extLinkBr  = "ext-br"
	extLinkExt = "eth0"
)

// resetResult is one run, as seen from the server and from the Pod.
type resetResult struct {
	masq      netip.AddrPort // the server's view of the client: node-a's address
	serverErr error          // the server socket's error after the injection
	rsts      int            // RSTs from the masquerade address seen on the server's link
	client    string         // the Pod's own account (workload resetclient)
}

func (r resetResult) reset() bool { return resettest.IsReset(r.serverErr) }

func (r resetResult) String() string {
	if r.reset() {
		return fmt.Sprintf("reset (server: %v; %d RST from %s; pod: %s)", r.serverErr, r.rsts, r.masq, r.client)
	}
	return fmt.Sprintf("kept (no RST; pod: %s)", r.client)
}

// newExternal makes the external namespace on the cluster's bridge.
func newExternal(t *testing.T, c *Cluster) *netns.NS {
	ext := netns.NewNoDAD(t, "nnmcl-ext")
	ext.Veth(extLinkExt, netns.Existing(t, c.cp.Netns()), extLinkBr)
	mustNS(t, c.cp.Netns(), "ip", "link", "set", extLinkBr, "master", bridge)
	ext.AddAddrs(extLinkExt, extIP+bridgeBits)
	return ext
}

// injectReset runs the reproduction once.
// Each run listens on its own port: the listeners stay open until the test ends.
func injectReset(t *testing.T, c *Cluster, ext *netns.NS, port uint16) resetResult {
	ctx := t.Context()
	server := netip.AddrPortFrom(netip.MustParseAddr(extIP), port)
	ln := ext.Listen(t, server.String())
	var capture *rawtcp.Capture
	if err := ext.Do(func() (err error) { capture, err = rawtcp.NewCapture(extLinkExt); return }); err != nil {
		t.Fatal(err)
	}
	defer capture.Close()

	type result struct {
		out string
		err error
	}
	clientDone := make(chan result, 1)
	go func() {
		out, err := c.Kubectl(context.Background(), "", "-n", testNS, "exec", "client-a", "--", "/workload", "resetclient", server.String(), resetWait)
		clientDone <- result{out, err}
	}()
	// kubectl exec through the apiserver to the kubelet and containerd: seconds under emulation.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Minute))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("external server: no connection from client-a: %v", err)
	}
	defer conn.Close()
	var r resetResult
	r.masq = conn.RemoteAddr().(*net.TCPAddr).AddrPort()
	r.masq = netip.AddrPortFrom(r.masq.Addr().Unmap(), r.masq.Port())
	if want := c.node("node-a").ip; r.masq.Addr().String() != want {
		t.Fatalf("the server sees client-a as %s, want node-a's masquerade address %s", r.masq, want)
	}
	if err := resettest.ReadExactly(conn, "ping\n", 10*time.Second); err != nil {
		t.Fatalf("server: %v", err)
	}
	if _, err := conn.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	last, seg, err := resettest.CraftAfterPong(ctx, capture, server, r.masq)
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := ext.Do(func() error { return rawtcp.Send(seg) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("injected %s (the server's last segment: %s)", seg, last.Segment)
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	switch {
	case n > 0:
		t.Fatalf("the server received %q after the injection, want nothing", buf[:n])
	case err != nil && !isTimeout(err):
		r.serverErr = err
	default:
		// Kept: the Pod's "after" must arrive, and the answer must reach it.
		if err := resettest.ReadExactly(conn, "after\n", 30*time.Second); err != nil {
			t.Errorf("server: after the injection: %v", err)
		} else if _, err := conn.Write([]byte("still here\n")); err != nil {
			t.Errorf("server: %v", err)
		}
	}
	// The capture reads in the background: give a reset's RST time to reach it.
	rsts := func() int {
		return len(capture.Filter(func(pk rawtcp.Packet) bool {
			return !pk.Outgoing && pk.Has(rawtcp.RST) && pk.Src == r.masq && !pk.Time.Before(sent)
		}))
	}
	if r.reset() {
		_ = agenttest.Poll(ctx, 2*time.Second, 20*time.Millisecond, func() error {
			if rsts() == 0 {
				return errors.New("no RST captured yet")
			}
			return nil
		})
	}
	r.rsts = rsts()
	select {
	case res := <-clientDone:
		if res.err != nil {
			t.Fatalf("client-a: %v", res.err)
		}
		r.client = strings.TrimSpace(lastLine(res.out))
	case <-time.After(2 * time.Minute):
		t.Fatal("client-a's kubectl exec did not end")
	}
	return r
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
