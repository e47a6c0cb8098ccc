// Package netnstest gives tests a network namespace of their own, so that they can program real
// netfilter rules and send real packets without touching the host.
//
// New creates the namespace ("ip netns add") and deletes it when the test ends. Do runs a function
// with the calling code's thread inside the namespace, so everything it executes (iptables, nft,
// sockets) happens there.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// NS is a named network namespace created for one test.
type NS struct {
	Name string
	t    testing.TB
}

// Require skips the test unless it runs as root with `ip netns` and the given binaries available.
func Require(t testing.TB, binaries ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces (CI runs as root)")
	}
	for _, b := range append([]string{"ip"}, binaries...) {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s in PATH (make test installs it): %v", b, err)
		}
	}
}

// New creates a namespace named prefix-<random> with loopback up, removed at test end.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	Require(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(b))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("cannot create network namespace %s: %v: %s", name, err, out)
	}
	ns := &NS{Name: name, t: t}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("delete network namespace %s: %v: %s", name, err, out)
		}
	})
	ns.MustExec("ip", "link", "set", "lo", "up")
	return ns
}

// Path is the namespace's file under /run/netns.
func (ns *NS) Path() string { return "/run/netns/" + ns.Name }

// Exec runs a command inside the namespace and returns its combined output.
func (ns *NS) Exec(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (in netns %s): %w: %s", strings.Join(args, " "), ns.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// MustExec is Exec that fails the test on error.
func (ns *NS) MustExec(args ...string) string {
	ns.t.Helper()
	out, err := ns.Exec(args...)
	if err != nil {
		ns.t.Fatal(err)
	}
	return out
}

// Do runs fn on an OS thread that has entered the namespace; processes fn starts and sockets it
// opens live there. The caller's own thread never changes namespace.
func (ns *NS) Do(fn func() error) error {
	return Do(ns.Path(), fn)
}

// Do runs fn on an OS thread locked inside the network namespace at path, then moves the thread
// back. If moving back fails the thread stays locked and the runtime discards it.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}
