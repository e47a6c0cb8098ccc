// Package node is the input of this node's Node object (Table) and of the pod CIDRs fixes read
// from it (PodCIDRs): the Node's spec.podCIDRs, else the configured podCIDRs.
package node

import (
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Resource is core/v1 Nodes.
var Resource = inputs.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "nodes", Kind: "Node",
	New: func() runtime.Object { return &corev1.Node{} }, NewList: func() runtime.Object { return &corev1.NodeList{} },
	AddToScheme: corev1.AddToScheme}

// Module provides both inputs.
var Module = fx.Module("input-node",
	fx.Provide(New),
	inputs.Provide(func(n *Input) *Input { return n }),
	inputs.Provide(NewPodCIDRs),
)

// Input fills Table: an informer of the one Node named like this node (field selector
// metadata.name).
type Input struct {
	inputs.Feed
	mu       sync.Mutex
	hub      inputs.Source
	nodeName string
	// onChange hear the Node after each event (OnChange).
	onChange []func(*corev1.Node)
}

// New returns the Node input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return inputs.Node }

// Resources are the Nodes.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Start starts the informer of this node's Node. Without a node name there is none, and the
// table stays empty (synced: pod CIDRs then come from the configuration).
func (in *Input) Start(h inputs.Source) error {
	in.mu.Lock()
	first := in.hub == nil
	in.hub, in.nodeName = h, h.NodeName()
	in.mu.Unlock()
	if h.NodeName() == "" {
		if first {
			h.Log().Warn("no node name configured: pod CIDRs come from the configuration only (set nodeName / NNM_NODE_NAME)")
		}
		return nil
	}
	return in.Watch(h, Resource, fields.OneTermEqualSelector("metadata.name", h.NodeName()).String(), transform, in.event)
}

// OnChange registers f to hear this node's Node (stripped; nil when it was deleted) after every
// event of the informer, from the informer's goroutine: f must not block. The agent re-resolves
// the configuration's nodeOverrides with it when the Node's labels change.
func (in *Input) OnChange(f func(*corev1.Node)) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.onChange = append(in.onChange, f)
}

func (in *Input) event(obj any, deleted bool) {
	n, _ := obj.(*corev1.Node)
	if deleted {
		n = nil
	}
	in.mu.Lock()
	subs := slices.Clone(in.onChange)
	in.mu.Unlock()
	for _, f := range subs {
		f(n)
	}
}

// Node is this node's Node object (stripped, StripNode), nil when unknown. Callers must not modify it.
func (in *Input) Node() *corev1.Node { return in.node() }

// Synced says whether the Node was listed; without a node name it never will be, which is no
// reason to wait.
func (in *Input) Synced() error {
	in.mu.Lock()
	noName := in.hub != nil && in.nodeName == ""
	in.mu.Unlock()
	if noName {
		return nil
	}
	return in.Feed.Synced(inputs.Node.Name())
}

// Value is the Node (*corev1.Node), nil when unknown.
func (in *Input) Value() any { return in.node() }

func (in *Input) node() *corev1.Node {
	store := in.Store()
	if store == nil {
		return nil
	}
	in.mu.Lock()
	name := in.nodeName
	in.mu.Unlock()
	o, ok, _ := store.GetByKey(name)
	if !ok {
		return nil
	}
	return o.(*corev1.Node)
}

func transform(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return StripNode(n), nil
	}
	return obj, nil
}

// StripNode keeps identity, labels (the configuration's nodeOverrides select nodes by them), pod
// CIDRs and the node's addresses (status.addresses: a DNAT fix must never take them over).
func StripNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels}}
	out.Spec.PodCIDR = n.Spec.PodCIDR
	out.Spec.PodCIDRs = n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}

// PodCIDRsInput fills PodCIDRs from the Node input and the configuration.
type PodCIDRsInput struct {
	node       *Input
	configured inputs.Configured[[]netip.Prefix]

	mu     sync.Mutex
	log    func(from string, haveNode bool, cidrs []netip.Prefix)
	source string // where the last value came from ("node", "config"), for logging
}

// NewPodCIDRs returns the pod CIDR input over the Node input.
func NewPodCIDRs(n *Input) *PodCIDRsInput { return &PodCIDRsInput{node: n} }

// Table is PodCIDRs.
func (in *PodCIDRsInput) Table() fix.TableRef { return inputs.PodCIDRs }

// Configure takes the configured podCIDRs (the fallback).
func (in *PodCIDRsInput) Configure(s inputs.Settings) {
	in.configured.Set(s.PodCIDRs)
}

// Start starts the Node input.
func (in *PodCIDRsInput) Start(h inputs.Source) error {
	in.mu.Lock()
	in.log = func(from string, haveNode bool, cidrs []netip.Prefix) { logSource(h, from, in.source, haveNode, cidrs) }
	in.mu.Unlock()
	return in.node.Start(h)
}

// Synced is the Node input's.
func (in *PodCIDRsInput) Synced() error { return in.node.Synced() }

// Revision moves with the Node's and the configuration's.
func (in *PodCIDRsInput) Revision() uint64 { return in.node.Revision() + in.configured.Revision() }

// Value is the pod CIDRs ([]netip.Prefix).
func (in *PodCIDRsInput) Value() any {
	n := in.node.node()
	cidrs, from := inputs.NodePodCIDRs(n), "node"
	if len(cidrs) == 0 {
		cidrs, from = in.configured.Get(), "config"
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.log != nil && from != in.source {
		in.log(from, n != nil, cidrs)
	}
	in.source = from
	return cidrs
}

// logSource logs once when the pod CIDRs change between the Node's and the configured ones (e.g.
// the Node object was deleted under the agent), not on every pass.
func logSource(h inputs.Source, from, prev string, haveNode bool, cidrs []netip.Prefix) {
	log := h.Log()
	switch {
	case from == "node":
		log.Info("pod CIDRs from the Node object", "podCIDRs", cidrs)
	case prev == "node" && !haveNode:
		log.Warn("the Node object is gone; falling back to the configured podCIDRs", "podCIDRs", cidrs)
	case prev == "node":
		log.Warn("the Node object has no spec.podCIDRs any more; falling back to the configured podCIDRs", "podCIDRs", cidrs)
	default:
		log.Info("the Node object has no pod CIDRs (yet); using the configured podCIDRs", "podCIDRs", cidrs, "nodeSeen", haveNode)
	}
}
