package dataplane

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// backends are the agent's rule backends; every "with agent" case runs once per backend, each time in
// a fresh topology.
var backends = []string{"iptables", "nftables"}

// require skips the test unless it runs as root with the agent binary and the given tools.
func require(t *testing.T, tools ...string) {
	t.Helper()
	netns.Require(t, tools...)
	agenttest.Require(t)
}

// dial opens a TCP connection from inside the namespace at nsPath.
func dial(ctx context.Context, nsPath string, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(nsPath, func() (err error) {
		c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr.String())
		return
	})
	return c, err
}

// fetch connects from ns to addr and reads everything the server sends until it closes. Any failure
// within timeout (connect or read) is an error.
func fetch(ctx context.Context, ns *netns.NS, addr netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	c, err := dial(ctx, ns.Path(), addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	b, err := io.ReadAll(c)
	if err != nil {
		return string(b), err
	}
	return string(b), nil
}

// parallel runs the functions concurrently and returns their results in order.
func parallel[T any](fns ...func() T) []T {
	out := make([]T, len(fns))
	var wg sync.WaitGroup
	for i, f := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f()
		}()
	}
	wg.Wait()
	return out
}
