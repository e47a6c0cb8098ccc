// Package netns gives fix tests a throwaway network namespace, so that kernel tests can program real
// rules and sysctls without touching the host. It is the public face of the project's one test
// environment (internal/testenv), usable from fix modules that live in other Go modules.
//
//	netns.RequireKernel(t, "nft")              // first line: skipped with -short, needs root and nft
//	ns := netns.New(t, "nnm-myfix")            // deleted when the test ends
//	ns.MustExec("iptables-save")               // a command inside the namespace
//	err := ns.Do(func() error { ... })         // Go code on a thread inside the namespace
//
// Without root (or `ip`) the test skips; under CI (CI=true or NNM_REQUIRE_KERNEL=1) it fails instead,
// so that a green CI run means the kernel tests ran. Use Unavailable for any other missing kernel
// feature, so it follows the same rule.
package netns

import (
	"net"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/testenv"
)

// NS is a network namespace created for one test (see New).
type NS = testenv.NS

// New creates a namespace named prefix-<random> with loopback up, deleted when the test ends.
func New(t testing.TB, prefix string) *NS { t.Helper(); return testenv.New(t, prefix) }

// Require ends the test unless it runs as root with `ip netns` and the named binaries available:
// a skip, or a failure under CI.
func Require(t testing.TB, binaries ...string) { t.Helper(); testenv.Require(t, binaries...) }

// RequireKernel starts a kernel test: a skip under -short (`make test-unit`), then Require.
func RequireKernel(t testing.TB, binaries ...string) {
	t.Helper()
	testenv.RequireKernel(t, binaries...)
}

// Unavailable ends the test because something it needs (a kernel feature, a module) is missing: a
// skip with the message, or a failure under CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.Unavailable(t, format, args...)
}

// Do runs fn on an OS thread locked inside the namespace at path (processes it starts live there).
func Do(path string, fn func() error) error { return testenv.Do(path, fn) }

// AcceptAndClose serves ln in the background until ln is closed, closing every connection at once:
// a server that only shows it can be reached (see Connect).
func AcceptAndClose(ln net.Listener) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// Connect opens a TCP connection from inside ns to addr and closes it: nil when addr accepted it
// within timeout, else the dial's error. Failing to enter ns fails the test, so that it never
// passes for an unreachable address.
func Connect(t testing.TB, ns *NS, addr string, timeout time.Duration) error {
	t.Helper()
	var err error
	if derr := ns.Do(func() error {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, timeout); err == nil {
			c.Close()
		}
		return nil
	}); derr != nil {
		t.Fatalf("enter %s: %v", ns.Name, derr)
	}
	return err
}

// ConnectWithin retries Connect (each attempt bounded by 500 ms) until addr accepts a connection
// or within has passed, and returns the last attempt's error: for checks that a path IS open,
// where a just-created veth or a loaded machine can lose the first attempt's SYN or ARP. A check
// that a path is closed uses one Connect, so that it cannot wait for a rule to go away.
func ConnectWithin(t testing.TB, ns *NS, addr string, within time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := Connect(t, ns, addr, 500*time.Millisecond)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
