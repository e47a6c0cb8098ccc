package metadatablock

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestKernel builds three network namespaces, pod ↔ node ↔ metadata, and checks with real TCP
// connections that the fix's rules, applied by each real backend in the node namespace, stop the pod
// from reaching 169.254.169.254:80 while the node still reaches it.
//
//	pod  10.244.1.2/24 ──veth── 10.244.1.1 node 169.254.169.1 ──veth── 169.254.169.254/24 metadata
func TestKernel(t *testing.T) {
	netns.RequireKernel(t, "iptables-restore", "nft")
	for _, name := range backends.Names {
		t.Run(name, func(t *testing.T) {
			node, pod, meta := netns.New(t, "nnm-mb-node"), netns.New(t, "nnm-mb-pod"), netns.New(t, "nnm-mb-meta")
			node.MustExec("ip", "link", "add", "to-pod", "type", "veth", "peer", "name", "eth0", "netns", pod.Name)
			node.MustExec("ip", "link", "add", "to-meta", "type", "veth", "peer", "name", "eth0", "netns", meta.Name)
			node.MustExec("ip", "addr", "add", "10.244.1.1/24", "dev", "to-pod")
			node.MustExec("ip", "addr", "add", "169.254.169.1/24", "dev", "to-meta")
			node.MustExec("ip", "link", "set", "to-pod", "up")
			node.MustExec("ip", "link", "set", "to-meta", "up")
			node.MustExec("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
			pod.MustExec("ip", "addr", "add", "10.244.1.2/24", "dev", "eth0")
			pod.MustExec("ip", "link", "set", "eth0", "up")
			pod.MustExec("ip", "route", "add", "default", "via", "10.244.1.1")
			meta.MustExec("ip", "addr", "add", "169.254.169.254/24", "dev", "eth0")
			meta.MustExec("ip", "link", "set", "eth0", "up")
			meta.MustExec("ip", "route", "add", "default", "via", "169.254.169.1")

			// The metadata server: a listener opened inside the metadata namespace.
			netns.AcceptAndClose(meta.Listen(t, "169.254.169.254:80"))
			// Open paths are retried for a few seconds (a fresh veth on a loaded machine can lose the
			// first SYN); the blocked path gets one attempt, confirmed by the drop counter below.
			reach := func(ns *netns.NS) bool {
				return netns.ConnectWithin(t, ns, "169.254.169.254:80", 5*time.Second) == nil
			}
			blocked := func(ns *netns.NS) bool {
				return netns.Connect(t, ns, "169.254.169.254:80", 500*time.Millisecond) != nil
			}
			if !reach(pod) || !reach(node) {
				t.Fatal("topology broken: the metadata server is not reachable before the fix")
			}

			be, err := backends.New(name, "nft", slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			f, err := New(fix.Params{Backend: be})
			if err != nil {
				t.Fatal(err)
			}
			rs, _, err := f.Rules(testkit.Snapshot(testkit.WithPodCIDRs("10.244.1.0/24")), rules.IPv4)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if err := node.Do(func() error { return testkit.Apply(ctx, be, rs) }); err != nil {
				t.Fatal(err)
			}
			if !blocked(pod) {
				t.Fatalf("%s: the pod still reaches the metadata address", name)
			}
			if !reach(node) {
				t.Fatalf("%s: the node lost its access to the metadata address", name)
			}
			dump := node.MustExec("nft", "list", "ruleset")
			if name == "iptables" {
				dump = node.MustExec("iptables-save")
			}
			if !strings.Contains(dump, "169.254.169.254") || !strings.Contains(strings.ToLower(dump), "metadata-block") {
				t.Fatalf("%s: the kernel does not hold the rule:\n%s", name, dump)
			}
			var dropped uint64
			if err := node.Do(func() error {
				cs, err := be.Counters(ctx, ID, rules.IPv4)
				dropped = cs[CounterName(mustAddr("169.254.169.254"))].Packets
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if dropped == 0 {
				t.Errorf("%s: the drop counter is 0 after a blocked connection", name)
			}
			// Removing the fix gives the pod its access back.
			if err := node.Do(func() error { return testkit.Remove(ctx, be, ID, rules.IPv4) }); err != nil {
				t.Fatal(err)
			}
			if !reach(pod) {
				t.Fatalf("%s: the pod is still blocked after Remove", name)
			}
		})
	}
}
