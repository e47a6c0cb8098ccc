package staleudpconntrack

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
)

// Pod IP reuse (issue #41, row 11), with a real kube-apiserver, the real engine and informers, and
// the real conntrack table of a node namespace. Pod A (10.244.1.30, fd00:244:1::30) is deleted;
// Pod B is scheduled to the node and its sandbox gets A's addresses, but its status does not show
// them yet (Pending, no pod IP): clients' flows to B are DNATed to A's old addresses. Pod D
// (10.244.1.31) goes while B waits.
//
//	entry                                           DNAT target              its Pod
//	client 192.0.2.7:40010 → 198.51.100.1:8125      10.244.1.30:8125         A, deleted
//	client 192.0.2.7:40011 → 198.51.100.1:8125      10.244.1.30:8125         B, waiting for its status
//	client 2001:db8::7:40011 → [2001:db8:1::1]:8125 [fd00:244:1::30]:8125    B (IPv6)
//	client 192.0.2.7:40012 → 198.51.100.1:8126      10.244.1.31:8125         D, deleted while B waits
const reuseNode = "n3"

var (
	reuseToA  = ctfill.Entry{Protocol: ctfill.UDP, Src: netip.MustParseAddrPort("192.0.2.7:40010"), Dst: netip.MustParseAddrPort("198.51.100.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.30:8125")}
	reuseToB4 = ctfill.Entry{Protocol: ctfill.UDP, Src: netip.MustParseAddrPort("192.0.2.7:40011"), Dst: netip.MustParseAddrPort("198.51.100.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.30:8125")}
	reuseToB6 = ctfill.Entry{Protocol: ctfill.UDP, Src: netip.MustParseAddrPort("[2001:db8::7]:40011"), Dst: netip.MustParseAddrPort("[2001:db8:1::1]:8125"), DNATTo: netip.MustParseAddrPort("[fd00:244:1::30]:8125")}
	reuseToD  = ctfill.Entry{Protocol: ctfill.UDP, Src: netip.MustParseAddrPort("192.0.2.7:40012"), Dst: netip.MustParseAddrPort("198.51.100.1:8126"), DNATTo: netip.MustParseAddrPort("10.244.1.31:8125")}
)

// entryID is the kernel id of the entry made from e (0: not in the table).
func entryID(t *testing.T, ct inNS, e ctfill.Entry) uint32 {
	t.Helper()
	for _, fam := range rules.Families {
		for _, k := range ct.list(t, fam, rules.UDP) {
			if k.Orig.Src == e.Src && k.Reply.Src == e.DNATTo {
				return k.ID
			}
		}
	}
	return 0
}

func fill(t *testing.T, ns *netns.NS, es ...ctfill.Entry) {
	t.Helper()
	if err := ns.Do(func() error { return ctfill.Create(len(es), func(i int) ctfill.Entry { return es[i] }) }); err != nil {
		t.Fatal(err)
	}
}

// TestKernelPodIPReuse: B's flows to A's reused addresses survive the full passes while B waits for
// its status (before the fix of row 11 they were deleted at every full pass), a Pod that goes
// meanwhile has its entries deleted only once B shows its addresses, and B's entries stay then.
func TestKernelPodIPReuse(t *testing.T) {
	netns.RequireKernel(t)
	if testing.Short() {
		t.Skip("kernel test")
	}
	ctx := context.Background()
	cs := startCluster(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: reuseNode}})
	createPodOn(t, cs, reuseNode, "a", "10.244.1.30", "fd00:244:1::30")
	createPodOn(t, cs, reuseNode, "d", "10.244.1.31")
	node := netns.New(t, "nnm-reuse")
	real := inNS{node, nodestate.NewConntrack()}
	fill(t, node, reuseToA, reuseToD)
	c := config.Defaults()
	c.NodeName = reuseNode
	c.MinSyncPeriod, c.SyncPeriod = 100*time.Millisecond, 500*time.Millisecond
	c.Fixes = map[string]map[string]any{ID: {"enabled": true}}
	e, m, reg := runEngine(t, cs, &c, real)
	agenttest.Until(t, wait, func() bool { return e.Ready() == nil })
	passes(t, m, 2) // the fix has seen A and D hold their addresses

	// A goes: its stale entry is deleted (the fix works).
	deletePod(t, cs, "a")
	agenttest.Until(t, wait, func() bool { return entryID(t, real, reuseToA) == 0 })

	// B is scheduled here and takes A's addresses; its status does not show them yet.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "b"},
		Spec: corev1.PodSpec{NodeName: reuseNode, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "statsd", Image: "example.invalid/statsd"}}}}
	b, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, wait, func() bool { // a pass has seen B wait for its addresses
		v, _ := testkit.Value(t, reg, "nnm_stale_udp_conntrack_waiting_pods")
		return v == 1
	})
	fill(t, node, reuseToB4, reuseToB6)
	idB4, idB6 := entryID(t, real, reuseToB4), entryID(t, real, reuseToB6)
	if idB4 == 0 || idB6 == 0 {
		t.Fatalf("B's entries were not made: %d %d", idB4, idB6)
	}
	// D goes while B waits: its address may be the one B is about to show, so nothing is deleted.
	deletePod(t, cs, "d")
	passes(t, m, 4) // several full passes
	if got4, got6 := entryID(t, real, reuseToB4), entryID(t, real, reuseToB6); got4 != idB4 || got6 != idB6 {
		t.Fatalf("B's entries to the reused addresses: ids %d, %d → %d, %d (0: deleted) while B waited for its status", idB4, idB6, got4, got6)
	}
	if entryID(t, real, reuseToD) == 0 {
		t.Fatal("D's entry was deleted while a Pod of this node was waiting for an address")
	}

	// B's status shows A's addresses: D's entry goes, B's stay.
	b.Status.Phase = corev1.PodRunning
	b.Status.PodIP = "10.244.1.30"
	b.Status.PodIPs = []corev1.PodIP{{IP: "10.244.1.30"}, {IP: "fd00:244:1::30"}}
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, wait, func() bool { return entryID(t, real, reuseToD) == 0 })
	passes(t, m, 2)
	if got4, got6 := entryID(t, real, reuseToB4), entryID(t, real, reuseToB6); got4 != idB4 || got6 != idB6 {
		t.Errorf("B's entries: ids %d, %d → %d, %d (0: deleted) after B showed its addresses", idB4, idB6, got4, got6)
	}
}
