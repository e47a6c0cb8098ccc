package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// The fleet benchmark at a small size (issue #42): every simulated agent and kube-proxy holds every
// Service after its first list, the agent's first list streams (a watch with sendInitialEvents, no
// LIST), and the bytes are counted (about 15 s). With NNM_SLOW=1 also: after a kube-apiserver
// restart every agent sees a Service created after it, with at most one relist per informer (no
// relist storm).
func TestFleetSmall(t *testing.T) {
	const n = 300
	t0 := time.Now()
	cp := controlplane.StartT(t, controlplane.Options{ServiceNodePortRange: scaleNodePortRange})
	if cp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c, err := newCluster(cp)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.seedServices(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := fleetIdentities(ctx, cp); err != nil {
		t.Fatal(err)
	}
	// want counts default/kubernetes, which kube-apiserver's controller creates after /readyz.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.client.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("default/kubernetes was not created: %v", err)
	}
	t.Logf("control plane and %d Services up after %v", n, time.Since(t0).Round(time.Millisecond))
	want := n + 1 // and default/kubernetes
	start := func(kind string, k int) (*fleetChildProc, fleetEvent) {
		t.Helper()
		p, err := startFleetChild(ctx, fleetSpec{Kind: kind, K: k, Kubeconfig: cp.AdminKubeconfig(), SyncTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := p.next(ctx, 90*time.Second)
		if err != nil {
			p.quit()
			t.Fatalf("%s: %v", kind, err)
		}
		t.Logf("%s K=%d: synced, last after %.2fs (%v)", kind, k, ev.SyncMax, time.Since(t0).Round(time.Millisecond))
		if ev.Synced != k || ev.MinObjects != want || ev.BytesIn <= 0 {
			t.Errorf("%s K=%d: %d synced, the fewest Services in a cache %d (want %d), %d bytes received", kind, k, ev.Synced, ev.MinObjects, want, ev.BytesIn)
		}
		return p, ev
	}
	for _, kind := range []string{"kube-proxy", "list"} {
		p, _ := start(kind, 2)
		p.quit()
	}
	p, ev := start("agent", 3)
	defer p.quit()
	if ev.Requests["list"] != 0 || ev.Requests["watchlist"] != 3*3 {
		t.Errorf("the agents' first lists: %v, want 9 streaming lists (3 informers each) and no LIST", ev.Requests)
	}
	// The restart takes 20-25 s more (the apiserver's shutdown and start with 300 Services).
	if os.Getenv("NNM_SLOW") == "" {
		t.Log("not restarting kube-apiserver: NNM_SLOW=1 does (20-25 s more)")
		return
	}

	if err := p.send("mark"); err != nil {
		t.Fatal(err)
	}
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	t.Logf("apiserver restarted (%v)", time.Since(t0).Round(time.Millisecond))
	name := fmt.Sprintf("fleet-test-%d", ready.UnixNano())
	if err := retry(ctx, func() error {
		_, err := c.client.CoreV1().Services(namespace).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.send(fmt.Sprintf("marker %s/%s %d", namespace, name, ready.UnixMilli())); err != nil {
		t.Fatal(err)
	}
	ev, err = p.next(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	relists := ev.Requests["list"] + ev.Requests["watchlist"]
	t.Logf("after the restart: marker in %d caches, last %.2fs after ready; requests %v, retries %d", ev.MarkerSeen, ev.MarkerMax, ev.Requests, ev.Retries)
	if ev.MarkerSeen != 3 {
		t.Errorf("%d of 3 agents saw a Service created after the restart", ev.MarkerSeen)
	}
	if relists > 3*3 {
		t.Errorf("%d relists for 9 informers after one restart: %v", relists, ev.Requests)
	}
}
