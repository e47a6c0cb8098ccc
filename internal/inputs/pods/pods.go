// Package pods is the input of the Pods scheduled to this node (Table): an informer with the field
// selector spec.nodeName, as the kubelet's, holding each Pod stripped to what tells which pod
// addresses are in use (StripPod).
package pods

import (
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Resource is core/v1 Pods.
var Resource = inputs.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "pods", Kind: "Pod", Namespaced: true,
	New: func() runtime.Object { return &corev1.Pod{} }, NewList: func() runtime.Object { return &corev1.PodList{} },
	AddToScheme: corev1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-pods", inputs.Provide(New))

// Input fills Table.
type Input struct{ inputs.Feed }

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return inputs.Pods }

// Resources are the Pods.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Start starts the informer of this node's Pods; without a node name there is none, and Synced
// says so.
func (in *Input) Start(h inputs.Source) error {
	if h.NodeName() == "" {
		in.Unwatchable("no node name")
		h.Log().Warn("no node name configured: this node's Pods cannot be watched (set nodeName / NNM_NODE_NAME)")
		return nil
	}
	in.Unwatchable("")
	return in.Watch(h, Resource, fields.OneTermEqualSelector("spec.nodeName", h.NodeName()).String(), transform, nil)
}

// Synced says whether the first list arrived.
func (in *Input) Synced() error { return in.Feed.Synced(inputs.Pods.Name()) }

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
	inputs.SortPods(out)
	return out
}

func transform(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return inputs.StripPod(p), nil
	}
	return obj, nil
}
