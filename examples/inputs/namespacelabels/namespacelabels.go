// Package namespacelabels is an input module written outside the agent's repository, against the
// SDK only (core/inputs): it fills the table Table with the cluster's Namespaces, stripped to their
// names and labels, so that a fix can ask which Namespaces carry a label (Labelled). A custom agent
// adds it with one line (examples/custom-agent: namespacelabels.Module); the agent starts its
// informer only when an enabled fix reads Table.
//
// Namespaces are not in the agent's base ClusterRole: an agent with a fix that reads this table
// needs "list" and "watch" on namespaces granted too.
package namespacelabels

import (
	"slices"
	"strings"

	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Table is the cluster's Namespaces sorted by name, each stripped to its name and labels.
var Table = fix.NewTable[[]*corev1.Namespace]("NamespaceLabels")

// Resource is core/v1 Namespaces.
var Resource = inputs.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "namespaces", Kind: "Namespace",
	New: func() runtime.Object { return &corev1.Namespace{} }, NewList: func() runtime.Object { return &corev1.NamespaceList{} },
	AddToScheme: corev1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-namespace-labels", inputs.Provide(New))

// Input fills Table from an informer of every Namespace.
type Input struct{ inputs.Feed }

var (
	_ inputs.Input   = (*Input)(nil)
	_ inputs.Watcher = (*Input)(nil)
)

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return Table }

// Resources are the Namespaces.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Start starts the informer of every Namespace.
func (in *Input) Start(s inputs.Source) error { return in.Watch(s, Resource, "", strip, nil) }

// Synced says whether the first list arrived.
func (in *Input) Synced() error { return in.Feed.Synced(Table.Name()) }

// Value is the Namespaces sorted by name ([]*corev1.Namespace); the objects are shared.
func (in *Input) Value() any {
	var out []*corev1.Namespace
	if store := in.Store(); store != nil {
		for _, o := range store.List() {
			if ns, ok := o.(*corev1.Namespace); ok {
				out = append(out, ns)
			}
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Namespace) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// strip keeps a Namespace's name, labels and resourceVersion (the informer cache keeps only that).
func strip(obj any) (any, error) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, ResourceVersion: ns.ResourceVersion,
			Labels: ns.Labels}}, nil
	}
	return obj, nil
}

// Labelled returns the names of the Namespaces whose label key has the value value, sorted.
func Labelled(namespaces []*corev1.Namespace, key, value string) []string {
	var out []string
	for _, ns := range namespaces {
		if v, ok := ns.Labels[key]; ok && v == value {
			out = append(out, ns.Name)
		}
	}
	return out
}
