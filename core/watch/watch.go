// Package watch is where the core learns about the cluster. A Source keeps the Services and this
// node's Node object and tells when they change; fixes never see it, only the Snapshot the core
// builds from it.
package watch

import (
	"context"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	Services() []*fix.Service
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

// Versioned is implemented by sources that number their states, so that a pass whose inputs did
// not change can reuse what it computed from them.
type Versioned interface {
	// Version returns a number that differs from every earlier one once anything that needs reads,
	// or the Node (every snapshot holds it), has changed; changes of other watches leave it as it
	// is. It moves after the change is visible through Services, Node, Pods and the rest, so a state
	// read after reading a version is at least as new as that version.
	Version(needs fix.Needs) uint64
}

// SortServices orders Services by namespace/name.
func SortServices(svcs []*fix.Service) { slices.SortStableFunc(svcs, fix.CompareServices) }

// cachedService is the form the informer cache holds a Service in: the compact fix.Service (the
// transform makes it as each Service arrives, so the cache never keeps a corev1.Service), with the
// metadata accessor the cache's key function and its resync check need.
type cachedService fix.Service

// GetObjectMeta gives client-go's cache the Service's namespace, name and resourceVersion.
func (s *cachedService) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}
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
	out := &corev1.Pod{ObjectMeta: identity(&p.ObjectMeta)}
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
	out := &corev1.Node{ObjectMeta: identity(&n.ObjectMeta)}
	out.Spec.PodCIDR = n.Spec.PodCIDR
	out.Spec.PodCIDRs = n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}

// identity is the part of an object's metadata that a stripped Pod or Node keeps: what names the
// object (namespace, name, UID) and its resourceVersion.
func identity(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
}
