package node

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

func TestStripNodeKeepsWhatFixesRead(t *testing.T) {
	in := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"l": "v"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.5"}, {Type: corev1.NodeExternalIP, Address: "2001:db8::5"}},
			Images:    []corev1.ContainerImage{{Names: []string{strings.Repeat("x", 1000)}}},
		},
	}
	out := StripNode(in)
	if out.ManagedFields != nil || out.Status.Images != nil {
		t.Fatalf("not stripped: %+v", out)
	}
	if out.Labels["l"] != "v" {
		t.Fatalf("lost the labels (nodeOverrides select by them): %+v", out.Labels)
	}
	if len(out.Spec.PodCIDRs) != 2 || len(out.Status.Addresses) != 2 || out.Status.Addresses[1].Address != "2001:db8::5" {
		t.Fatalf("lost what fixes read: %+v", out)
	}
}

// The pod CIDRs are the Node's while it has any, else the configured ones; a Node deleted under the
// agent makes the table fall back, and that is logged once, not on every read (#15 item 8).
func TestPodCIDRsPreferTheNodeAndLogTheFallbackOnce(t *testing.T) {
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}}})
	var logs testkit.LogBuffer
	h := watch.NewHub(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "n1", slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(h.Stop)
	in := NewPodCIDRs(New())
	in.Configure(inputs.Settings{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}})
	if err := in.Start(h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	until := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			select {
			case <-ctx.Done():
				t.Fatalf("never: %s", what)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	until("synced", func() bool { return in.Synced() == nil })
	if got := in.Value().([]netip.Prefix); len(got) != 2 || got[0].String() != "10.244.1.0/24" {
		t.Fatalf("with the Node: %v", got)
	}
	rev := in.Revision()
	if err := cs.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until("the fallback", func() bool {
		got := in.Value().([]netip.Prefix)
		return len(got) == 1 && got[0].String() == "10.0.0.0/24"
	})
	for range 3 {
		in.Value()
	}
	if in.Revision() == rev {
		t.Error("the revision did not move with the Node's deletion")
	}
	if n := strings.Count(logs.String(), "the Node object is gone"); n != 1 || !strings.Contains(logs.String(), "10.0.0.0/24") {
		t.Errorf("the fallback was logged %d times (want once, naming the configured CIDRs):\n%s", n, logs.String())
	}
}

// Without a node name the Node cannot be watched: the table is synced at once and empty, and the
// pod CIDRs are the configured ones.
func TestWithoutNodeNameThePodCIDRsAreConfigured(t *testing.T) {
	h := watch.Offline(slog.New(slog.DiscardHandler))
	in := NewPodCIDRs(New())
	in.Configure(inputs.Settings{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}})
	if err := in.Start(h); err != nil {
		t.Fatal(err)
	}
	if err := in.Synced(); err != nil {
		t.Fatalf("Synced = %v; want nil without a node name", err)
	}
	if got := in.Value().([]netip.Prefix); len(got) != 1 || got[0].String() != "10.0.0.0/24" {
		t.Fatalf("Value = %v", got)
	}
}
