// Package watch is where the core learns about the cluster. A Source keeps the Services and this
// node's Node object and tells when they change; fixes never see it, only the Snapshot the core
// builds from it.
package watch

import (
	"context"
	"slices"
	"sort"
	"unique"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// Source is a view of the cluster that fixes' snapshots are built from.
type Source interface {
	// Start begins watching what needs asks for. It does not block; Stop ends everything it started.
	Start(ctx context.Context, needs fix.Needs) error
	// WaitForSync blocks until the first full list arrived (or ctx ends).
	WaitForSync(ctx context.Context) error
	// Services returns the current Services sorted by namespace/name. Callers must not modify them.
	// A Service that changed is a new object; one that did not is the same object as in the previous
	// call (fix.ServiceMap relies on it to recompute only what changed).
	Services() []*corev1.Service
	// Node returns this node's Node object, nil if unknown.
	Node() *corev1.Node
	// Pods returns the Pods scheduled to this node, sorted by namespace/name (stripped by StripPod).
	// Callers must not modify them.
	Pods() []*corev1.Pod
	// Changes receives a value (coalesced) after anything the source holds changed.
	Changes() <-chan struct{}
	// Stop ends the watches and waits for them.
	Stop()
}

// SortServices orders Services by namespace/name.
func SortServices(svcs []*corev1.Service) {
	sort.Slice(svcs, func(i, j int) bool {
		if svcs[i].Namespace != svcs[j].Namespace {
			return svcs[i].Namespace < svcs[j].Namespace
		}
		return svcs[i].Name < svcs[j].Name
	})
}

// StripService keeps only what fixes read: identity, spec and load-balancer status. It is the
// informer's transform, so the cache holds the small form (managed fields and annotations of
// thousands of Services are most of their size). Values that thousands of Services share (type,
// protocols, port names, families) point to one copy each, and the Cluster-IP to its entry in
// ClusterIPs: at 10,000 Services the cache holds about 1 KB per Service, most of it the
// corev1.Service struct itself (BENCHMARKS.md, Memory).
func StripService(svc *corev1.Service) *corev1.Service {
	out := &corev1.Service{}
	out.Namespace = svc.Namespace
	out.Name = svc.Name
	out.ResourceVersion = svc.ResourceVersion
	out.Spec = corev1.ServiceSpec{
		Type:                  intern(svc.Spec.Type),
		ClusterIP:             svc.Spec.ClusterIP,
		ClusterIPs:            svc.Spec.ClusterIPs,
		ExternalIPs:           svc.Spec.ExternalIPs,
		ExternalName:          svc.Spec.ExternalName,
		ExternalTrafficPolicy: intern(svc.Spec.ExternalTrafficPolicy),
		IPFamilies:            internFamilies(svc.Spec.IPFamilies),
		Ports:                 stripPorts(svc.Spec.Ports),
	}
	if len(out.Spec.ClusterIPs) > 0 && out.Spec.ClusterIPs[0] == out.Spec.ClusterIP {
		out.Spec.ClusterIP = out.Spec.ClusterIPs[0]
	}
	out.Status.LoadBalancer = svc.Status.LoadBalancer
	return out
}

func stripPorts(ports []corev1.ServicePort) []corev1.ServicePort {
	if len(ports) == 0 {
		return nil
	}
	out := make([]corev1.ServicePort, len(ports))
	for i, p := range ports {
		out[i] = corev1.ServicePort{Name: intern(p.Name), Protocol: intern(p.Protocol), Port: p.Port}
	}
	return out
}

// intern returns the one shared copy of a short value many objects repeat.
func intern[S ~string](s S) S {
	if s == "" || len(s) > 32 {
		return s
	}
	return S(unique.Make(string(s)).Value())
}

// The IP families of nearly every Service are one of these.
var familyLists = [][]corev1.IPFamily{
	{corev1.IPv4Protocol}, {corev1.IPv6Protocol},
	{corev1.IPv4Protocol, corev1.IPv6Protocol}, {corev1.IPv6Protocol, corev1.IPv4Protocol},
}

func internFamilies(fams []corev1.IPFamily) []corev1.IPFamily {
	for _, l := range familyLists {
		if slices.Equal(l, fams) {
			return slices.Clip(l)
		}
	}
	return fams
}

// SortPods orders Pods by namespace/name.
func SortPods(pods []*corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
}

// StripPod keeps identity, the node, host networking, the phase and the pod's addresses: what tells
// which pod addresses are in use on this node. Containers, volumes, conditions and managed fields
// (most of a Pod's size) are dropped by the informer's transform.
func StripPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{}
	out.Namespace = p.Namespace
	out.Name = p.Name
	out.UID = p.UID
	out.ResourceVersion = p.ResourceVersion
	out.DeletionTimestamp = p.DeletionTimestamp
	out.Spec.NodeName = p.Spec.NodeName
	out.Spec.HostNetwork = p.Spec.HostNetwork
	out.Status.Phase = p.Status.Phase
	out.Status.PodIP = p.Status.PodIP
	out.Status.PodIPs = p.Status.PodIPs
	return out
}

// StripNode keeps identity, pod CIDRs and the node's addresses (status.addresses: a DNAT fix must
// never take them over).
func StripNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{}
	out.Name = n.Name
	out.UID = n.UID
	out.ResourceVersion = n.ResourceVersion
	out.Spec.PodCIDR = n.Spec.PodCIDR
	out.Spec.PodCIDRs = n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}
