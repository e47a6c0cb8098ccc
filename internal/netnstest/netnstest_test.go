package netnstest

import (
	"os"
	"strings"
	"testing"
)

func TestDoEntersNamespaceAndLeavesCallerAlone(t *testing.T) {
	ns := New(t, "nnmt-self")
	ns.MustExec("ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
	before, _ := os.Readlink("/proc/thread-self/ns/net")
	var inside string
	if err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		inside = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(inside, "probe0") {
		t.Fatalf("Do did not run inside %s; /proc/net/dev:\n%s", ns.Name, inside)
	}
	after, _ := os.Readlink("/proc/thread-self/ns/net")
	if before != after {
		t.Fatalf("caller's thread changed namespace: %s -> %s", before, after)
	}
	host, _ := os.ReadFile("/proc/thread-self/net/dev")
	if strings.Contains(string(host), "probe0") {
		t.Fatal("the dummy link leaked into the host namespace")
	}
}
