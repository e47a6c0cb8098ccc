// Package netns gives fix tests a throwaway network namespace, so that kernel tests can program real
// rules and sysctls without touching the host. It is the public face of the project's own helper,
// usable from fix modules that live in other Go modules.
//
//	ns := netns.New(t, "nnm-myfix")            // skips without root; deleted when the test ends
//	ns.MustExec("iptables-save")               // a command inside the namespace
//	err := ns.Do(func() error { ... })         // Go code on a thread inside the namespace
package netns

import (
	"testing"

	"github.com/network-node-manager/network-node-manager/internal/netnstest"
)

// NS is a network namespace created for one test (see New).
type NS = netnstest.NS

// New creates a namespace named prefix-<random> with loopback up, deleted when the test ends. It
// skips the test with a clear message when not root.
func New(t testing.TB, prefix string) *NS { t.Helper(); return netnstest.New(t, prefix) }

// Require skips the test unless it runs as root with `ip netns` and the named binaries available.
func Require(t testing.TB, binaries ...string) { t.Helper(); netnstest.Require(t, binaries...) }

// Do runs fn on an OS thread locked inside the namespace at path (processes it starts live there).
func Do(path string, fn func() error) error { return netnstest.Do(path, fn) }
