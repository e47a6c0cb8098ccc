package netns

import (
	"os/exec"
	"strings"
	"testing"
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
