// Package pods is the input of the Pods scheduled to this node (Table): an informer with the field
// selector spec.nodeName, as the kubelet's, holding each Pod stripped to what tells which pod
// addresses are in use (StripPod).
package pods

import (
	"cmp"
	"slices"
	"strings"

	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Table is this node's Pods sorted by namespace/name, stripped (StripPod).
var Table = fix.NewTable[[]*corev1.Pod]("Pods")

// Resource is core/v1 Pods.
var Resource = kube.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "pods", Kind: "Pod", Namespaced: true,
	New: func() runtime.Object { return &corev1.Pod{} }, NewList: func() runtime.Object { return &corev1.PodList{} },
	AddToScheme: corev1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-pods", watch.Provide(New))

// Input fills Table.
type Input struct{ watch.Feed }

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return Table }

// Resources are the Pods.
func (in *Input) Resources() []kube.Resource { return []kube.Resource{Resource} }

// Start starts the informer of this node's Pods; without a node name there is none, and Synced
// says so.
func (in *Input) Start(h *watch.Hub) error {
	if h.NodeName() == "" {
		in.Unwatchable("no node name")
		h.Log().Warn("no node name configured: this node's Pods cannot be watched (set nodeName / NNM_NODE_NAME)")
		return nil
	}
	in.Unwatchable("")
	return in.Watch(h, Resource, fields.OneTermEqualSelector("spec.nodeName", h.NodeName()).String(), transform, nil)
}

// Synced says whether the first list arrived.
func (in *Input) Synced() error { return in.Feed.Synced(Table.Name()) }

// Value is the sorted Pods ([]*corev1.Pod); the objects are shared.
func (in *Input) Value() any {
	store := in.Store()
	if store == nil {
		return []*corev1.Pod(nil)
	}
	var out []*corev1.Pod
	for _, o := range store.List() {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	Sort(out)
	return out
}

// Sort orders Pods by namespace/name.
func Sort(pods []*corev1.Pod) {
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
}

func transform(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return StripPod(p), nil
	}
	return obj, nil
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
