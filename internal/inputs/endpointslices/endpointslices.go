// Package endpointslices is the input of the cluster's EndpointSlices (discovery.k8s.io/v1):
// the table Table, filled by an informer of every EndpointSlice, each stripped to what tells where a
// Service's endpoints run (StripEndpointSlice). A fix that asks "does this Service have a ready
// endpoint on this node?" reads it with LocalEndpoints.
package endpointslices

import (
	"cmp"
	"slices"
	"strings"

	"go.uber.org/fx"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Resource is discovery.k8s.io/v1 EndpointSlices.
var Resource = inputs.Resource{GroupVersion: discoveryv1.SchemeGroupVersion, Name: "endpointslices", Kind: "EndpointSlice", Namespaced: true,
	New:         func() runtime.Object { return &discoveryv1.EndpointSlice{} },
	NewList:     func() runtime.Object { return &discoveryv1.EndpointSliceList{} },
	AddToScheme: discoveryv1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-endpointslices", inputs.Provide(New))

// Input fills Table.
type Input struct{ inputs.Feed }

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return inputs.EndpointSlices }

// Resources are the EndpointSlices.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Start starts the informer of every EndpointSlice.
func (in *Input) Start(h inputs.Source) error { return in.Watch(h, Resource, "", transform, nil) }

// Synced says whether the first list arrived.
func (in *Input) Synced() error { return in.Feed.Synced(inputs.EndpointSlices.Name()) }

// Value is the sorted EndpointSlices ([]*discoveryv1.EndpointSlice); the objects are shared.
func (in *Input) Value() any {
	store := in.Store()
	if store == nil {
		return []*discoveryv1.EndpointSlice(nil)
	}
	var out []*discoveryv1.EndpointSlice
	for _, o := range store.List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

func transform(obj any) (any, error) {
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		return StripEndpointSlice(s), nil
	}
	return obj, nil
}

// StripEndpointSlice keeps identity, the Service it belongs to (label kubernetes.io/service-name),
// the address type, the ports, and per endpoint its addresses, conditions and node: what tells
// where a Service's endpoints run and whether they serve. Hints, zones, target references and
// managed fields are dropped.
func StripEndpointSlice(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	out := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, UID: s.UID,
		ResourceVersion: s.ResourceVersion}, AddressType: s.AddressType, Ports: s.Ports}
	if svc, ok := s.Labels[discoveryv1.LabelServiceName]; ok {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
	for i, e := range s.Endpoints {
		out.Endpoints[i] = discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, NodeName: e.NodeName}
	}
	return out
}

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
