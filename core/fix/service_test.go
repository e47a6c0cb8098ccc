package fix_test

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

func TestServiceFromKeepsWhatFixesRead(t *testing.T) {
	in := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "s", ResourceVersion: "42", Annotations: map[string]string{"a": "x"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00::1"},
			ExternalIPs: []string{"203.0.113.1", "not-an-ip", "fe80::1%eth0"}, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector: map[string]string{"app": "x"},
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}, {Protocol: corev1.ProtocolUDP, Port: 53}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{Hostname: "lb.example"}, {IP: "203.0.113.2", IPMode: new(corev1.LoadBalancerIPModeProxy)}, {IP: "::ffff:203.0.113.3"}, {IP: "203.0.113.999"}}}},
	}
	want := &fix.Service{Namespace: "n", Name: "s", ResourceVersion: "42", Type: fix.ServiceTypeLoadBalancer, LocalTrafficPolicy: true,
		ClusterIPs:  []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")},
		ExternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.1")},
		Ingress:     []fix.Ingress{{IP: netip.MustParseAddr("203.0.113.2"), Proxy: true}, {IP: netip.MustParseAddr("::ffff:203.0.113.3")}},
		Ports:       []fix.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}, {Protocol: corev1.ProtocolUDP, Port: 53}},
		Invalid: []fix.InvalidAddr{{Field: "spec.externalIPs[1]", Value: "not-an-ip"}, {Field: "spec.externalIPs[2]", Value: "fe80::1%eth0"},
			{Field: "status.loadBalancer.ingress[3].ip", Value: "203.0.113.999"}},
	}
	got := fix.ServiceFrom(in)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if got.Key() != "n/s" || got.Type.String() != "LoadBalancer" {
		t.Errorf("key %q, type %q", got.Key(), got.Type)
	}
}

func TestServiceFromKinds(t *testing.T) {
	headless := fix.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone}}})
	if !headless.Headless || headless.ClusterIPs != nil || headless.Invalid != nil || headless.Type != fix.ServiceTypeClusterIP {
		t.Errorf("headless: %+v", headless)
	}
	old := fix.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.9"}})
	if len(old.ClusterIPs) != 1 || old.ClusterIPs[0] != netip.MustParseAddr("10.96.0.9") || old.Type != fix.ServiceTypeNodePort {
		t.Errorf("spec.clusterIP without clusterIPs: %+v", old)
	}
	alias := fix.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}})
	if alias.Type != fix.ServiceTypeExternalName || alias.ClusterIPs != nil {
		t.Errorf("ExternalName: %+v", alias)
	}
}

// Values thousands of Services repeat are one copy: the namespace and the port names.
func TestServiceFromInterns(t *testing.T) {
	mk := func(name string) *fix.Service {
		ns, port := string([]byte("bench")), string([]byte("http")) // fresh copies, as decoding makes them
		return fix.ServiceFrom(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: port, Port: 80}}}})
	}
	a, b := mk("a"), mk("b")
	if unsafe.StringData(a.Namespace) != unsafe.StringData(b.Namespace) || unsafe.StringData(a.Ports[0].Name) != unsafe.StringData(b.Ports[0].Name) {
		t.Error("namespace or port name not interned")
	}
}

// A list longer than fix.MaxHeldPerService is not held: the field is empty, Oversized names it with
// its length, and OversizedSkip refuses the Service under the service budget; a list of exactly
// MaxHeldPerService is held.
func TestServiceFromOversized(t *testing.T) {
	ports := func(n int) []corev1.ServicePort {
		out := make([]corev1.ServicePort, n)
		for i := range out {
			out[i] = corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: int32(i%65535 + 1)}
		}
		return out
	}
	ips := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}).String()
		}
		return out
	}
	held := fix.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{Ports: ports(fix.MaxHeldPerService), ExternalIPs: ips(fix.MaxHeldPerService)}})
	if len(held.Ports) != fix.MaxHeldPerService || len(held.ExternalIPs) != fix.MaxHeldPerService || held.Oversized != nil {
		t.Fatalf("%d ports and addresses: held %d and %d, oversized %v", fix.MaxHeldPerService, len(held.Ports), len(held.ExternalIPs), held.Oversized)
	}
	if _, over := held.OversizedSkip(); over {
		t.Error("a Service whose lists are all held is refused")
	}
	n := fix.MaxHeldPerService + 1
	big := fix.ServiceFrom(&corev1.Service{Spec: corev1.ServiceSpec{Ports: ports(30000), ExternalIPs: ips(n), ClusterIPs: []string{"10.96.0.1"}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.1"}}}}})
	want := []fix.Oversized{{Field: "spec.externalIPs", Len: n}, {Field: "spec.ports", Len: 30000}}
	if big.Ports != nil || big.ExternalIPs != nil || !reflect.DeepEqual(big.Oversized, want) {
		t.Fatalf("ports %d, externalIPs %d, oversized %+v; want none held and %+v", len(big.Ports), len(big.ExternalIPs), big.Oversized, want)
	}
	if len(big.Ingress) != 1 || len(big.ClusterIPs) != 1 {
		t.Errorf("the short lists were not held: ingress %v, clusterIPs %v", big.Ingress, big.ClusterIPs)
	}
	sk, over := big.OversizedSkip()
	if !over || sk.Reason != fix.ReasonServiceBudget || !strings.Contains(sk.Detail, "spec.ports has 30000 items") || !strings.Contains(sk.Detail, fmt.Sprintf("spec.externalIPs has %d items", n)) {
		t.Errorf("OversizedSkip: %+v, %v", sk, over)
	}
}
