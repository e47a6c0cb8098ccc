package diagnose

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/internal/inputs/endpointslices"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/inputs/pods"
	"github.com/network-node-manager/network-node-manager/internal/inputs/services"
	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// ClusterTables are the tables the checks read from the API.
var ClusterTables = []fix.TableRef{inputs.Node, inputs.Pods, inputs.Services, inputs.EndpointSlices}

// ListTimeout bounds each list of ReadCluster.
const ListTimeout = 15 * time.Second

type contextLister interface {
	ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
}

// PageSize is how many objects one list request of ReadCluster asks for: at 100 endpoints an
// EndpointSlice, a page of them decodes to a few MiB, where one list of 10,000 Services' slices
// held the whole cluster's endpoints at once (#61: 200,000 endpoints peaked at 149 MiB).
const PageSize = 250

// list lists resource r (with a field selector) page by page and hands each object to keep, which
// keeps what the checks need of it; nothing of a page outlives the call to keep. Each page is
// bounded by ListTimeout. The pages are consistent reads: a list with resourceVersion 0 is served
// whole from the API server's cache, whatever its limit.
func list(ctx context.Context, client kube.Interface, r inputs.Resource, selector string, keep func(runtime.Object)) error {
	lw, ok := client.ListWatch(r, selector).(contextLister)
	if !ok {
		return fmt.Errorf("list %s: the client cannot list with a deadline", r.Name)
	}
	opts := metav1.ListOptions{Limit: PageSize}
	for {
		pctx, cancel := context.WithTimeout(ctx, ListTimeout)
		obj, err := lw.ListWithContext(pctx, opts)
		cancel()
		if err != nil {
			return fmt.Errorf("list %s: %w", r.Name, err)
		}
		items, err := meta.ExtractList(obj)
		if err != nil {
			return fmt.Errorf("list %s: %w", r.Name, err)
		}
		for _, o := range items {
			keep(o)
		}
		lm, err := meta.ListAccessor(obj)
		if err != nil {
			return fmt.Errorf("list %s: %w", r.Name, err)
		}
		if opts.Continue = lm.GetContinue(); opts.Continue == "" {
			return nil
		}
	}
}

// ReadCluster lists, once and page by page, what the checks read: this node's Node and Pods (field
// selectors), the Services (compact, fix.Service) and the EndpointSlices, of which it keeps only
// the endpoints on this node (LocalSlice). A table that cannot be read is left out and named in
// missing with the error. Without a node name the Node, the Pods and the EndpointSlices are missing.
func ReadCluster(ctx context.Context, client kube.Interface, nodeName string) (*fix.Snapshot, map[string]string) {
	snap := fix.NewSnapshot(fix.Env{NodeName: nodeName}, nil)
	missing := map[string]string{}
	if nodeName == "" {
		for _, t := range []fix.TableRef{inputs.Node, inputs.Pods, inputs.EndpointSlices} {
			missing[t.Name()] = "no node name (nodeName / NNM_NODE_NAME)"
		}
	} else {
		var n *corev1.Node
		if err := list(ctx, client, node.Resource, fields.OneTermEqualSelector("metadata.name", nodeName).String(), func(o runtime.Object) {
			if x, ok := o.(*corev1.Node); ok {
				n = x
			}
		}); err != nil {
			missing[inputs.Node.Name()] = err.Error()
		} else if n == nil {
			missing[inputs.Node.Name()] = "no Node named " + nodeName
		} else {
			inputs.Node.Set(snap, n)
		}
		var ps []*corev1.Pod
		if err := list(ctx, client, pods.Resource, fields.OneTermEqualSelector("spec.nodeName", nodeName).String(), func(o runtime.Object) {
			if p, ok := o.(*corev1.Pod); ok {
				ps = append(ps, inputs.StripPod(p))
			}
		}); err != nil {
			missing[inputs.Pods.Name()] = err.Error()
		} else {
			inputs.Pods.Set(snap, ps)
		}
		var es []*discoveryv1.EndpointSlice
		if err := list(ctx, client, endpointslices.Resource, "", func(o runtime.Object) {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				if l := LocalSlice(s, nodeName); l != nil {
					es = append(es, l)
				}
			}
		}); err != nil {
			missing[inputs.EndpointSlices.Name()] = err.Error()
		} else {
			inputs.EndpointSlices.Set(snap, es)
		}
	}
	var ss []*fix.Service
	if err := list(ctx, client, services.Resource, "", func(o runtime.Object) {
		if s, ok := o.(*corev1.Service); ok {
			ss = append(ss, fix.ServiceFrom(s))
		}
	}); err != nil {
		missing[inputs.Services.Name()] = err.Error()
	} else {
		slices.SortFunc(ss, fix.CompareServices)
		inputs.Services.Set(snap, ss)
	}
	return snap, missing
}

// LocalSlice is what the checks keep of an EndpointSlice: its Service and its endpoints on node
// (their conditions; no addresses), or nil when it has none there.
func LocalSlice(s *discoveryv1.EndpointSlice, nodeName string) *discoveryv1.EndpointSlice {
	var out *discoveryv1.EndpointSlice
	for _, e := range s.Endpoints {
		if e.NodeName == nil || *e.NodeName != nodeName {
			continue
		}
		if out == nil {
			out = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name,
				Labels: map[string]string{discoveryv1.LabelServiceName: s.Labels[discoveryv1.LabelServiceName]}},
				AddressType: s.AddressType}
		}
		out.Endpoints = append(out.Endpoints, discoveryv1.Endpoint{Conditions: e.Conditions, NodeName: &nodeName})
	}
	return out
}

// NoAPI records that the cluster's objects cannot be read at all (err says why): the report's api
// field holds err, the checks that need a table say "no API access".
func (e *Env) NoAPI(err error) {
	e.Cluster, e.APIErr = nil, err.Error()
	e.Missing = map[string]string{}
	for _, t := range ClusterTables {
		e.Missing[t.Name()] = "no API access"
	}
}

// FromAgent is the cluster part of an Env in the running agent: the engine's snapshot, which holds
// only the tables the enabled fixes read (reads); the others are missing, so the agent adds no
// list or watch of its own for the diagnosis.
func FromAgent(snap *fix.Snapshot, reads []string) map[string]string {
	missing := map[string]string{}
	for _, t := range ClusterTables {
		if !slices.Contains(reads, t.Name()) {
			missing[t.Name()] = "the agent watches " + t.Name() + " only while an enabled fix reads it; run `network-node-manager diagnose` for a one-off read"
		}
	}
	return missing
}

// PodCIDRsOf returns this node's pod CIDRs: the Node's spec.podCIDRs, else the configured ones, and
// why there are none.
func PodCIDRsOf(snap *fix.Snapshot, missing map[string]string, configured []netip.Prefix) ([]netip.Prefix, string) {
	if snap != nil {
		if p := inputs.PodCIDRs.Get(snap); len(p) > 0 {
			return p, ""
		}
		if n := inputs.Node.Get(snap); n != nil {
			if p := inputs.NodePodCIDRs(n); len(p) > 0 {
				return p, ""
			}
		}
	}
	if len(configured) > 0 {
		return configured, ""
	}
	if why, ok := missing[inputs.Node.Name()]; ok {
		return nil, "the Node was not read (" + why + ") and no podCIDRs are configured"
	}
	return nil, "the Node has no spec.podCIDRs and no podCIDRs are configured"
}
