package inputs

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// The tables of the agent's own inputs. A fix names those it reads in its Spec's Reads and reads
// one with Get: inputs.Services.Get(snap).
var (
	// Services is the cluster's Services sorted by namespace/name, in the compact form fixes read.
	// A Service that changed is a new object; one that did not is the same object as in the
	// previous snapshot (fix.ServiceMap relies on it to recompute only what changed).
	Services = fix.NewTable[[]*fix.Service]("Services")
	// Node is this node's Node object, stripped to identity, labels, pod CIDRs and addresses; nil
	// when unknown (no node name, or the object is gone).
	Node = fix.NewTable[*corev1.Node]("Node")
	// PodCIDRs is this node's pod CIDRs: the Node's spec.podCIDRs, else the configured podCIDRs.
	PodCIDRs = fix.NewTable[[]netip.Prefix]("PodCIDRs")
	// Pods is this node's Pods (spec.nodeName), sorted by namespace/name, stripped to identity,
	// phase and addresses.
	Pods = fix.NewTable[[]*corev1.Pod]("Pods")
	// ServiceCIDRs is the ServiceCIDR objects' ranges, else the configured serviceCIDRs.
	ServiceCIDRs = fix.NewTable[[]netip.Prefix]("ServiceCIDRs")
	// EndpointSlices is the cluster's EndpointSlices sorted by namespace/name, stripped to what
	// tells where a Service's endpoints run (see LocalEndpoints).
	EndpointSlices = fix.NewTable[[]*discoveryv1.EndpointSlice]("EndpointSlices")
)

// LocalEndpoints counts the ready endpoints of the Service namespace/name on the node nodeName
// (endpoint conditions: ready unset counts as ready, as kube-proxy reads it).
func LocalEndpoints(eps []*discoveryv1.EndpointSlice, namespace, name, nodeName string) int {
	n := 0
	for _, s := range eps {
		if s.Namespace != namespace || s.Labels[discoveryv1.LabelServiceName] != name {
			continue
		}
		for _, e := range s.Endpoints {
			if e.NodeName != nil && *e.NodeName == nodeName && (e.Conditions.Ready == nil || *e.Conditions.Ready) {
				n++
			}
		}
	}
	return n
}

// NodePodCIDRs returns the node's spec.podCIDRs (else spec.podCIDR), masked; nil for none or a nil node.
func NodePodCIDRs(node *corev1.Node) []netip.Prefix {
	if node == nil {
		return nil
	}
	var out []netip.Prefix
	for _, s := range node.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	if len(out) == 0 && node.Spec.PodCIDR != "" {
		if p, err := netip.ParsePrefix(node.Spec.PodCIDR); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// StripPod keeps identity, the node, host networking, the phase and the pod's addresses: what tells
// which pod addresses are in use on this node. Containers, volumes, conditions and managed fields
// (most of a Pod's size) are dropped by the informer's transform.
func StripPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}}
	out.DeletionTimestamp = p.DeletionTimestamp
	out.Spec.NodeName = p.Spec.NodeName
	out.Spec.HostNetwork = p.Spec.HostNetwork
	out.Status.Phase = p.Status.Phase
	out.Status.PodIP = p.Status.PodIP
	out.Status.PodIPs = p.Status.PodIPs
	return out
}

// SortPods orders Pods by namespace/name.
func SortPods(pods []*corev1.Pod) {
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
}
