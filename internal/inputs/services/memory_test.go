package services_test

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
	"github.com/network-node-manager/network-node-manager/internal/inputs/services"
)

// BenchmarkMemoryPerService prints what one Service costs in live heap on the agent's data path,
// all in, at 10,000 and 50,000 Services: the informer cache's entry (the compact fix.Service the
// transform makes from a Service decoded from protobuf, as the API sends it, with two
// managed-fields entries like the scale benchmark's Services; the store's key and map slot), the
// sorted list snapshots hand out, and the state ipvs-externalip-dnat keeps for it after an IPv4
// Rules call (both fix.ServiceMaps, the map entries of the ruleset, which the nftables backend
// keeps as they are). Live heap is HeapAlloc after a forced GC, before and after each step.
// Run: go test -run - -bench MemoryPerService -benchtime 1x ./internal/inputs/services
func BenchmarkMemoryPerService(b *testing.B) {
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			blobs := make([][]byte, n)
			for i := range n {
				var err error
				if blobs[i], err = benchService(i).Marshal(); err != nil {
					b.Fatal(err)
				}
			}
			for range b.N {
				h0 := liveHeap()
				store := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
				set, list := services.NewSorted()
				for _, blob := range blobs {
					var s corev1.Service
					if err := s.Unmarshal(blob); err != nil {
						b.Fatal(err)
					}
					obj, err := services.Transform(&s)
					if err != nil {
						b.Fatal(err)
					}
					if err := store.Add(obj); err != nil {
						b.Fatal(err)
					}
					set(obj, false)
				}
				svcs := list()
				h1 := liveHeap()
				f, err := ipvsexternalipdnat.New(fix.Params{Registry: prometheus.NewRegistry()})
				if err != nil {
					b.Fatal(err)
				}
				snap := fix.NewSnapshot(fix.Env{}, nil)
				inputs.Services.Set(snap, svcs)
				inputs.ServiceCIDRs.Set(snap, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
				rs, _, err := f.Rules(snap, rules.IPv4)
				if err != nil || len(rs.Maps[0].Entries) != n {
					b.Fatalf("%d entries, %v", len(rs.Maps[0].Entries), err)
				}
				h2 := liveHeap()
				b.ReportMetric(float64(h1-h0)/float64(n), "B-cache/svc")
				b.ReportMetric(float64(h2-h1)/float64(n), "B-fix-state/svc")
				b.ReportMetric(float64(h2-h0)/float64(n), "B-total/svc")
				runtime.KeepAlive(store)
				runtime.KeepAlive(rs)
				runtime.KeepAlive(f)
			}
		})
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// benchNamespace spreads the Services over namespaces that stay within fix.MaxEntriesPerNamespace,
// as the scale benchmark does, so all 50,000 are programmed.
func benchNamespace(i int) string {
	return fmt.Sprintf("bench-%d", i/(fix.MaxEntriesPerNamespace/2))
}

func benchService(i int) *corev1.Service {
	no := false
	single := corev1.IPFamilyPolicySingleStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: benchNamespace(i), UID: "0a1b2c3d-aaaa-bbbb-cccc-0123456789ab", ResourceVersion: "123456",
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "bench", Operation: "Update", APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 600)}},
				{Manager: "bench", Operation: "Update", APIVersion: "v1", FieldsType: "FieldsV1", Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: make([]byte, 100)}},
			}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.12.34", ClusterIPs: []string{"10.96.12.34"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort: 31234, AllocateLoadBalancerNodePorts: &no, Selector: map[string]string{"app": "x"}, SessionAffinity: corev1.ServiceAffinityNone,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{IP: fmt.Sprintf("172.16.%d.%d", i/250, i%250+1), IPMode: new(corev1.LoadBalancerIPModeVIP)}}}},
	}
}
