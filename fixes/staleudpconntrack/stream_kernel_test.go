package staleudpconntrack

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
)

// TestKernelWaitingPodStream (issue #63 row 4), with a real kube-apiserver, the real engine and
// informers, and the real conntrack table of a node namespace: Pods of the node wait for an address
// one after the other (a new one every second, each deleted after two: slow volumes, an IPAM
// outage), so that some Pod always waits within pendingGrace (3 s here), and Pod A (10.244.1.40) is
// deleted meanwhile while a client's flow is DNATed to it. At main 3f85643 the waiting Pods held
// every deletion back while A's retention (2 s here) ran: A was forgotten without a word
// (dead_addresses 0, held_back 0) and the flow stayed DNATed to it for good. Now A is held back for
// pendingGrace at most, shown by held_back_addresses{reason="pod-waiting"}, and then judged: the
// entry goes, although Pods still wait, and the log says why.
func TestKernelWaitingPodStream(t *testing.T) {
	netns.RequireKernel(t)
	if testing.Short() {
		t.Skip("kernel test")
	}
	const name = "n4"
	toA := ctfill.Entry{Protocol: ctfill.UDP, Src: netip.MustParseAddrPort("192.0.2.7:40020"), Dst: netip.MustParseAddrPort("198.51.100.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.40:8125")}
	ctx := context.Background()
	cs := startCluster(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	createPodOn(t, cs, name, "a", "10.244.1.40")
	node := netns.New(t, "nnm-stream")
	real := inNS{node, nodestate.NewConntrack()}
	fill(t, node, toA)
	c := config.Defaults()
	c.NodeName = name
	c.MinSyncPeriod, c.SyncPeriod = 100*time.Millisecond, 500*time.Millisecond
	grace, retention := 3*time.Second, 2*time.Second
	c.Fixes = map[string]map[string]any{ID: {"enabled": true, "pendingGrace": grace.String(), "retention": retention.String()}}
	var log testkit.LogBuffer
	e, m, reg := runEngineLogging(t, &log, cs, &c, real)
	agenttest.Until(t, wait, func() bool { return e.Ready() == nil })
	passes(t, m, 2) // the fix has seen A hold its address

	// The stream of waiting Pods.
	streamCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; streamCtx.Err() == nil; i++ {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("w%d", i)},
				Spec: corev1.PodSpec{NodeName: name, AutomountServiceAccountToken: new(bool),
					Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}}}}
			if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Errorf("create a waiting Pod: %v", err)
				return
			}
			if i >= 2 {
				_ = cs.CoreV1().Pods("default").Delete(ctx, fmt.Sprintf("w%d", i-2), metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
			select {
			case <-streamCtx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()
	time.Sleep(2 * time.Second) // Pods wait

	deleted := time.Now()
	deletePod(t, cs, "a")
	held := false
	agenttest.Until(t, grace+wait, func() bool {
		v, _ := testkit.Value(t, reg, "nnm_stale_udp_conntrack_held_back_addresses", "reason", "pod-waiting")
		held = held || v == 1
		return entryID(t, real, toA) == 0
	})
	took := time.Since(deleted)
	if v, _ := testkit.Value(t, reg, "nnm_stale_udp_conntrack_waiting_pods"); v == 0 {
		t.Error("no Pod waits any more: the test did not hold a Pod waiting throughout")
	}
	t.Logf("A's entry deleted %v after A's deletion, with Pods waiting throughout (pendingGrace %v, retention %v)", took.Round(10*time.Millisecond), grace, retention)
	if !held {
		t.Error(`held_back_addresses{reason="pod-waiting"} never showed A's address held back`)
	}
	if took < grace-time.Second {
		t.Errorf("A's entry was deleted %v after A went, before its hold of pendingGrace (%v) ended", took, grace)
	}
	if !strings.Contains(log.String(), "judging a dead address although a Pod of this node still waits") || !strings.Contains(log.String(), "10.244.1.40") {
		t.Errorf("the log does not say why A's address was judged while Pods waited:\n%s", log.String())
	}
}
