package servicecidrs

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"x": "y"}},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// start runs the input on cs with serviceCIDRs 10.96.0.0/12 configured, until it synced.
func start(t *testing.T, cs *fake.Clientset) (*Input, context.Context) {
	t.Helper()
	h := watch.NewHub(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "n1", slog.New(slog.DiscardHandler))
	t.Cleanup(h.Stop)
	in := New()
	in.Configure(inputs.Settings{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}})
	if err := in.Start(h); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	for in.Synced() != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("not synced: %v", in.Synced())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return in, ctx
}

// Where discovery lists servicecidrs, the table holds the ranges of every ServiceCIDR object
// (sorted, masked, without duplicates), and a new object shows up with a new revision.
func TestServiceCIDRsServed(t *testing.T) {
	cs := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"), serviceCIDR("extra", "10.100.0.0/24", "10.96.0.0/16"))
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "servicecidrs"}}}}
	in, ctx := start(t, cs)
	want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.100.0.0/24"), netip.MustParsePrefix("fd00:10:96::/112")}
	if got := in.Value().([]netip.Prefix); !slices.Equal(got, want) {
		t.Fatalf("Value = %v; want %v", got, want)
	}
	rev := in.Revision()
	if _, err := cs.NetworkingV1().ServiceCIDRs().Create(ctx, serviceCIDR("more", "10.200.0.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for !slices.Contains(in.Value().([]netip.Prefix), netip.MustParsePrefix("10.200.0.0/24")) {
		select {
		case <-ctx.Done():
			t.Fatal("a new ServiceCIDR object never showed up")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if in.Revision() == rev {
		t.Error("the revision did not move with the new object")
	}
}

// An API without ServiceCIDR objects, or one that has none, does not hold the input up: it holds
// the configured serviceCIDRs.
func TestServiceCIDRsFallBackToTheConfiguration(t *testing.T) {
	configured := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	for name, served := range map[string]string{"not served": "ingresses", "no object": "servicecidrs"} {
		cs := fake.NewClientset()
		cs.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: served}}}}
		in, _ := start(t, cs)
		if got := in.Value().([]netip.Prefix); !slices.Equal(got, configured) {
			t.Errorf("%s: Value = %v; want the configured %v", name, got, configured)
		}
	}
}

// Agents that start together (a rollout) while the API server does not answer must not ask
// discovery again in lockstep: over 100 agents, no 100 ms window of any of the first six retries
// holds more than a third of them (without jitter every window held all 100), and the waits still
// grow to the cap (15-30 s).
func TestDiscoveryBackoffSpreadsRetries(t *testing.T) {
	const agents, retries = 100, 6
	backoffs := make([]wait.Backoff, agents)
	at := make([]time.Duration, agents)
	for i := range backoffs {
		backoffs[i] = discoveryBackoff()
	}
	for r := 0; r < retries; r++ {
		buckets := map[time.Duration]int{}
		for i := range backoffs {
			at[i] += backoffs[i].Step()
			buckets[at[i]/(100*time.Millisecond)]++
		}
		busiest := 0
		for _, n := range buckets {
			busiest = max(busiest, n)
		}
		if busiest > agents/3 {
			t.Errorf("retry %d: %d of %d agents in the same 100 ms", r+1, busiest, agents)
		}
	}
	b := discoveryBackoff()
	for range 20 {
		b.Step()
	}
	if d := b.Step(); d < 15*time.Second || d >= 30*time.Second {
		t.Errorf("wait after 20 retries %v, want 15-30 s", d)
	}
}
