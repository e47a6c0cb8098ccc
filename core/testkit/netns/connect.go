// Package netns is the project's one test environment: throwaway network namespaces, so that kernel
// tests program real rules and sysctls without touching the host, commands, Go code and programs run
// inside them, and the rule for tests whose prerequisites are missing. Every kernel, dataplane,
// end-to-end and control-plane test reaches the machine through it, and so can fix modules that live
// in other Go modules.
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
)

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
