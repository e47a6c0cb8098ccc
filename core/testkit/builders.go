// Package testkit is what fix authors use in unit tests: small builders for Services, Nodes and
// Snapshots (kube-proxy style mutator functions), a validating fake backend, the readable ruleset
// formatter that golden files use, and a golden-file helper.
//
// Typical use:
//
//	snap := testkit.Snapshot(
//		testkit.WithServices(testkit.Service("default", "web",
//			testkit.ClusterIPs("10.96.0.10"), testkit.LoadBalancer("203.0.113.10"),
//			testkit.Ports(testkit.TCP(80)))),
//		testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24"))),
//	)
//	rs, report, err := f.Rules(snap, rules.IPv4)
//	testkit.Golden(t, "testdata/web.golden", testkit.Format(rs))
package testkit

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// PortSpec is one Service port; build it with TCP, UDP, SCTP and Named.
type PortSpec = corev1.ServicePort

// Service returns a Service of type ClusterIP (without addresses) changed by mods in order.
func Service(ns, name string, mods ...func(*corev1.Service)) *corev1.Service {
	return with(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP},
	}, mods)
}

// with changes obj by mods in order and returns it.
func with[T any](obj *T, mods []func(*T)) *T {
	for _, m := range mods {
		m(obj)
	}
	return obj
}

// first is the first of xs, "" when there is none: spec.clusterIP of spec.clusterIPs, spec.podCIDR of
// spec.podCIDRs.
func first(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return xs[0]
}

// ClusterIPs sets spec.clusterIP (the first) and spec.clusterIPs, and spec.ipFamilies to match.
func ClusterIPs(ips ...string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.ClusterIPs, svc.Spec.ClusterIP = slices.Clone(ips), first(ips)
		svc.Spec.IPFamilies = nil
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip); err == nil {
				if a.Unmap().Is4() {
					svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, corev1.IPv4Protocol)
				} else {
					svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, corev1.IPv6Protocol)
				}
			}
		}
	}
}

// ClusterIPType sets type ClusterIP.
func ClusterIPType() func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.Type = corev1.ServiceTypeClusterIP }
}

// NodePortType sets type NodePort.
func NodePortType() func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.Type = corev1.ServiceTypeNodePort }
}

// Headless makes the Service headless (clusterIP None).
func Headless() func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
		svc.Spec.ClusterIP = corev1.ClusterIPNone
		svc.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	}
}

// ExternalName makes the Service an ExternalName Service for host (no Cluster-IP).
func ExternalName(host string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeExternalName
		svc.Spec.ExternalName = host
		svc.Spec.ClusterIP = ""
		svc.Spec.ClusterIPs = nil
		svc.Spec.IPFamilies = nil
	}
}

// LoadBalancer sets type LoadBalancer and appends one status.loadBalancer.ingress entry per IP.
func LoadBalancer(ingress ...string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		for _, ip := range ingress {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
	}
}

// IngressProxyMode sets type LoadBalancer and appends an ingress entry for ip with ipMode Proxy (KEP-1860).
func IngressProxyMode(ip string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		mode := corev1.LoadBalancerIPModeProxy
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip, IPMode: &mode})
	}
}

// IngressVIPMode appends an ingress entry for ip with an explicit ipMode VIP.
func IngressVIPMode(ip string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		mode := corev1.LoadBalancerIPModeVIP
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip, IPMode: &mode})
	}
}

// IngressHostname appends a hostname-only ingress entry (as AWS ELBs report).
func IngressHostname(host string) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{Hostname: host})
	}
}

// ExternalIPs appends to spec.externalIPs.
func ExternalIPs(ips ...string) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, ips...) }
}

// ETPLocal sets externalTrafficPolicy Local.
func ETPLocal() func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
}

// Ports appends Service ports.
func Ports(ports ...PortSpec) func(*corev1.Service) {
	return func(svc *corev1.Service) { svc.Spec.Ports = append(svc.Spec.Ports, ports...) }
}

// TCP is an unnamed TCP Service port.
func TCP(port int32) PortSpec { return PortSpec{Protocol: corev1.ProtocolTCP, Port: port} }

// UDP is an unnamed UDP Service port.
func UDP(port int32) PortSpec { return PortSpec{Protocol: corev1.ProtocolUDP, Port: port} }

// SCTP is an unnamed SCTP Service port.
func SCTP(port int32) PortSpec { return PortSpec{Protocol: corev1.ProtocolSCTP, Port: port} }

// Named gives p a name.
func Named(name string, p PortSpec) PortSpec {
	p.Name = name
	return p
}

// Node returns a Node changed by mods in order.
func Node(name string, mods ...func(*corev1.Node)) *corev1.Node {
	return with(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, mods)
}

// PodCIDRs sets spec.podCIDR (the first) and spec.podCIDRs.
func PodCIDRs(cidrs ...string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Spec.PodCIDRs, n.Spec.PodCIDR = slices.Clone(cidrs), first(cidrs)
	}
}

// Snapshot builds a snapshot changed by mods, then sorts Services by namespace/name as the core does.
// When no mod set the pod CIDRs (inputs.PodCIDRs), they are taken from the Node's spec.podCIDRs
// (unparsable ones are left out), as the core does when no pod CIDR is configured.
func Snapshot(mods ...func(*fix.Snapshot)) *fix.Snapshot {
	s := with(fix.NewSnapshot(fix.Env{}, nil), mods)
	SortServices(inputs.Services.Get(s))
	if inputs.PodCIDRs.Get(s) == nil {
		if cidrs := inputs.NodePodCIDRs(inputs.Node.Get(s)); cidrs != nil {
			inputs.PodCIDRs.Set(s, cidrs)
		}
	}
	return s
}

// WithServices adds Services to the snapshot (inputs.Services), in the compact form the core hands
// to fixes (fix.ServiceFrom); each call makes new objects.
func WithServices(svcs ...*corev1.Service) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) {
		list := inputs.Services.Get(s)
		for _, svc := range svcs {
			list = append(list, fix.ServiceFrom(svc))
		}
		inputs.Services.Set(s, list)
	}
}

// WithNode sets the snapshot's Node (inputs.Node, and Env.NodeName).
func WithNode(n *corev1.Node) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) {
		inputs.Node.Set(s, n)
		if n != nil {
			s.Env.NodeName = n.Name
		}
	}
}

// WithPodCIDRs sets the snapshot's pod CIDRs (inputs.PodCIDRs) explicitly (as if configured); it
// panics on a bad prefix. Called with no argument it records "no pod CIDR" and stops the Node's from
// being used.
func WithPodCIDRs(cidrs ...string) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) {
		out := []netip.Prefix{}
		for _, c := range cidrs {
			out = append(out, netip.MustParsePrefix(c))
		}
		inputs.PodCIDRs.Set(s, out)
	}
}

// WithServiceCIDRs sets the cluster's Service CIDRs (inputs.ServiceCIDRs: as if from ServiceCIDR
// objects or configured); it panics on a bad prefix.
func WithServiceCIDRs(cidrs ...string) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) {
		out := inputs.ServiceCIDRs.Get(s)
		for _, c := range cidrs {
			out = append(out, netip.MustParsePrefix(c))
		}
		inputs.ServiceCIDRs.Set(s, out)
	}
}

// WithPods sets this node's Pods (inputs.Pods), stripped and sorted as the core hands them.
func WithPods(ps ...*corev1.Pod) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) {
		out := slices.Clone(inputs.Pods.Get(s))
		for _, p := range ps {
			out = append(out, inputs.StripPod(p))
		}
		inputs.SortPods(out)
		inputs.Pods.Set(s, out)
	}
}

// WithProxyMode sets Env.ProxyMode ("ipvs", "iptables", "nftables").
func WithProxyMode(mode string) func(*fix.Snapshot) {
	return func(s *fix.Snapshot) { s.Env.ProxyMode = mode }
}

// SortServices sorts Services by namespace/name in place.
func SortServices(svcs []*fix.Service) { slices.SortStableFunc(svcs, fix.CompareServices) }

// Key is "namespace/name" of a Service, as fixes name it in Skip.Object.
func Key(svc *corev1.Service) string { return fmt.Sprintf("%s/%s", svc.Namespace, svc.Name) }

// Reads names the tables f reads, in the order its Spec lists them: "Services, Node" ("" for none).
func Reads(f fix.Fix) string {
	var names []string
	for _, t := range f.Reads() {
		names = append(names, t.Name())
	}
	return strings.Join(names, ", ")
}
