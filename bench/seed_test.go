package main

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
)

// The scale Services are spread so that no namespace holds more than the per-namespace budget of
// any backend lets in (one entry per Service; iptables's is lower than the default), and scaleNamespaces lists exactly the namespaces they use, so every
// one of them is created before a Service is written into it.
func TestScaleNamespacesFitTheBudget(t *testing.T) {
	for _, n := range []int{1, scalePerNamespace, scalePerNamespace + 1, 10000, 50000} {
		count := map[string]int{}
		for i := 0; i < n; i++ {
			count[scaleNamespace(i)]++
		}
		listed := scaleNamespaces(n)
		if len(listed) != len(count) {
			t.Errorf("n=%d: scaleNamespaces lists %d namespaces %v, the Services use %d", n, len(listed), listed, len(count))
		}
		for _, ns := range listed {
			if count[ns] == 0 {
				t.Errorf("n=%d: %s is listed but holds no Service", n, ns)
			}
		}
		for ns, c := range count {
			for _, b := range backend.Names {
				if limit := fix.BudgetFor(b, fix.MemoryLimit).PerNamespace; c > limit {
					t.Errorf("n=%d: %s holds %d Services, over the %s backend's namespace budget %d (fix.BudgetFor)", n, ns, c, b, limit)
				}
			}
		}
	}
	if got, want := len(scaleNamespaces(50000)), (50000+scalePerNamespace-1)/scalePerNamespace; got != want {
		t.Errorf("50,000 Services are in %d namespaces, want %d", got, want)
	}
	// The change-latency Services sort before every scale namespace (they are let in first when
	// the fix's budget is full).
	if ns := scaleNamespace(0); !(namespace < ns) {
		t.Errorf("namespace %q does not sort before %q", namespace, ns)
	}
}

// A Service written into etcd carries its namespace in the object and in its IPAddress's parent.
func TestSeededServiceNamespace(t *testing.T) {
	tmpl := lbService(scaleName(0))
	tmpl.Namespace = scaleNamespace(0)
	ipTmpl := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: "10.0.0.10"},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: tmpl.Namespace, Name: tmpl.Name}}}
	i := scalePerNamespace + 7
	svc, addr := seededService(tmpl, ipTmpl, i, netip.MustParseAddr("10.0.0.11"), 30000)
	want := fmt.Sprintf("bench-scale-%d", 1)
	if svc.Namespace != want || addr.Spec.ParentRef.Namespace != want || addr.Spec.ParentRef.Name != svc.Name {
		t.Errorf("Service %s/%s, IPAddress parent %s/%s; want both in %s", svc.Namespace, svc.Name, addr.Spec.ParentRef.Namespace, addr.Spec.ParentRef.Name, want)
	}
	if tmpl.Namespace != scaleNamespace(0) || ipTmpl.Spec.ParentRef.Namespace != scaleNamespace(0) {
		t.Errorf("seededService changed its templates")
	}
}
