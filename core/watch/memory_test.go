package watch_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/watch"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
)

// BenchmarkMemoryPerService prints what 10,000 Services cost in memory on the data path: the
// stripped objects the informer cache holds (decoded from protobuf, as the API sends them, with two
// managed-fields entries like the scale benchmark's Services) and the state ipvs-externalip-dnat
// keeps for them (fix.ServiceMap). Run: go test -run - -bench MemoryPerService -benchtime 1x ./core/watch
func BenchmarkMemoryPerService(b *testing.B) {
	const n = 10000
	blobs := make([][]byte, n)
	for i := range n {
		svc := benchService(i)
		var err error
		if blobs[i], err = svc.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		h0 := liveHeap()
		svcs := make([]*corev1.Service, n)
		for i, blob := range blobs {
			var s corev1.Service
			if err := s.Unmarshal(blob); err != nil {
				b.Fatal(err)
			}
			svcs[i] = watch.StripService(&s)
		}
		h1 := liveHeap()
		f, err := ipvsexternalipdnat.New(fix.Params{Registry: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		rs, _, err := f.Rules(&fix.Snapshot{Services: svcs}, rules.IPv4)
		if err != nil {
			b.Fatal(err)
		}
		h2 := liveHeap()
		b.ReportMetric(float64(h1-h0)/n, "B-stripped/svc")
		b.ReportMetric(float64(h2-h1)/n, "B-fix-state/svc")
		runtime.KeepAlive(svcs)
		runtime.KeepAlive(rs)
		runtime.KeepAlive(f)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func benchService(i int) *corev1.Service {
	no := false
	single := corev1.IPFamilyPolicySingleStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: "bench", UID: "0a1b2c3d-aaaa-bbbb-cccc-0123456789ab", ResourceVersion: "123456",
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
