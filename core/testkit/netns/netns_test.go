package netns

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestNamespaceIsIsolated(t *testing.T) {
	RequireKernel(t)
	ns := New(t, "nnm-netns")
	ns.MustExec("ip", "link", "add", "nnmprobe0", "type", "veth", "peer", "name", "nnmprobe1")
	if out := ns.MustExec("ip", "-o", "link"); !strings.Contains(out, "nnmprobe0") {
		t.Fatalf("link not created in the namespace: %s", out)
	}
	if out, _ := exec.Command("ip", "-o", "link").CombinedOutput(); strings.Contains(string(out), "nnmprobe0") {
		t.Fatal("the link leaked to the host")
	}
	if err := Do(ns.Path(), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestAcceptAndCloseAndConnect(t *testing.T) {
	if testing.Short() {
		t.Skip("kernel test")
	}
	ns := New(t, "nnm-netns")
	ln := ns.Listen(t, "127.0.0.1:0")
	AcceptAndClose(ln)
	if err := Connect(t, ns, ln.Addr().String(), time.Second); err != nil {
		t.Errorf("Connect to the served listener: %v", err)
	}
	// A port nothing listens on refuses the connection.
	if err := Connect(t, ns, "127.0.0.1:1", time.Second); err == nil {
		t.Error("Connect to a port nothing listens on succeeded")
	}
}
