package watch

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/kube"
	"github.com/network-node-manager/network-node-manager/core/kube/kubetest"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"x": "y"}},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestServiceCIDRsServed: where discovery lists servicecidrs, the ranges of every ServiceCIDR object
// are returned (sorted, masked, without duplicates) once synced, and a new object shows up.
func TestServiceCIDRsServed(t *testing.T) {
	cs := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"), serviceCIDR("extra", "10.100.0.0/24", "10.96.0.0/16"))
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "servicecidrs"}}}}
	s := NewInformers(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "n1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Start(ctx, fix.Needs{ServiceCIDRs: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.WaitForNeeds(ctx, fix.Needs{ServiceCIDRs: true}); err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.100.0.0/24"), netip.MustParsePrefix("fd00:10:96::/112")}
	if got, served := s.ServiceCIDRs(); !served || !slices.Equal(got, want) {
		t.Fatalf("ServiceCIDRs() = %v, %v; want %v, true", got, served, want)
	}
	if _, err := cs.NetworkingV1().ServiceCIDRs().Create(ctx, serviceCIDR("more", "10.200.0.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		if got, _ := s.ServiceCIDRs(); slices.Contains(got, netip.MustParsePrefix("10.200.0.0/24")) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("a new ServiceCIDR object never showed up")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestServiceCIDRsNotServed: an API without ServiceCIDR objects does not hold the watches up; the
// source says they are not served (the engine then uses the configured serviceCIDRs).
func TestServiceCIDRsNotServed(t *testing.T) {
	cs := fake.NewClientset()
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "ingresses"}}}}
	s := NewInformers(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "n1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Start(ctx, fix.Needs{Services: true, ServiceCIDRs: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.WaitForSync(ctx); err != nil {
		t.Fatalf("an API without ServiceCIDR objects held the watches up: %v", err)
	}
	if got, served := s.ServiceCIDRs(); served || got != nil {
		t.Fatalf("ServiceCIDRs() = %v, %v; want nil, false", got, served)
	}
}
