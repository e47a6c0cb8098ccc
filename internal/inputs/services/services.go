// Package services is the input of the cluster's Services: the table Table, filled by an informer
// of every Service, in the compact form fixes read (fix.Service).
package services

import (
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Resource is core/v1 Services.
var Resource = inputs.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "services", Kind: "Service", Namespaced: true,
	New: func() runtime.Object { return &corev1.Service{} }, NewList: func() runtime.Object { return &corev1.ServiceList{} },
	AddToScheme: corev1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-services", inputs.Provide(New))

// Input fills Table.
type Input struct {
	inputs.Feed
	sorted sortedServices // the Services of the informer's events, sorted
}

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return inputs.Services }

// Resources are the Services.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Start starts the informer of every Service.
func (in *Input) Start(h inputs.Source) error {
	return in.Watch(h, Resource, "", transform, in.sorted.set)
}

// Synced says whether the first list arrived.
func (in *Input) Synced() error { return in.Feed.Synced(inputs.Services.Name()) }

// Value is the sorted Services ([]*fix.Service); the slice and the objects are shared.
func (in *Input) Value() any { return in.sorted.list() }

// cachedService is the form the informer cache holds a Service in: the compact fix.Service (the
// transform makes it as each Service arrives, so the cache never keeps a corev1.Service), with the
// metadata accessor the cache's key function and its resync check need.
type cachedService fix.Service

// GetObjectMeta gives client-go's cache the Service's namespace, name and resourceVersion.
func (s *cachedService) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}
}

func transform(obj any) (any, error) {
	if svc, ok := obj.(*corev1.Service); ok {
		return (*cachedService)(fix.ServiceFrom(svc)), nil
	}
	return obj, nil
}
