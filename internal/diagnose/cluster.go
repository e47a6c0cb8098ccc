package diagnose

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/network-node-manager/network-node-manager/core/fix"
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

func list(ctx context.Context, client kube.Interface, r kube.Resource, selector string) ([]runtime.Object, error) {
	ctx, cancel := context.WithTimeout(ctx, ListTimeout)
	defer cancel()
	lw, ok := client.ListWatch(r, selector).(contextLister)
	if !ok {
		return nil, fmt.Errorf("list %s: the client cannot list with a deadline", r.Name)
	}
	obj, err := lw.ListWithContext(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r.Name, err)
	}
	return meta.ExtractList(obj)
}

// ReadCluster lists, once, what the checks read: this node's Node and Pods (field selectors), the
// Services and the EndpointSlices. A table that cannot be read is left out and named in missing
// with the error. Without a node name the Node and the Pods are missing.
func ReadCluster(ctx context.Context, client kube.Interface, nodeName string) (*fix.Snapshot, map[string]string) {
	snap := fix.NewSnapshot(fix.Env{NodeName: nodeName}, nil)
	missing := map[string]string{}
	if nodeName == "" {
		missing[inputs.Node.Name()] = "no node name (nodeName / NNM_NODE_NAME)"
		missing[inputs.Pods.Name()] = "no node name (nodeName / NNM_NODE_NAME)"
	} else {
		if objs, err := list(ctx, client, node.Resource, fields.OneTermEqualSelector("metadata.name", nodeName).String()); err != nil {
			missing[inputs.Node.Name()] = err.Error()
		} else if len(objs) == 0 {
			missing[inputs.Node.Name()] = "no Node named " + nodeName
		} else if n, ok := objs[0].(*corev1.Node); ok {
			inputs.Node.Set(snap, n)
		}
		if objs, err := list(ctx, client, pods.Resource, fields.OneTermEqualSelector("spec.nodeName", nodeName).String()); err != nil {
			missing[inputs.Pods.Name()] = err.Error()
		} else {
			var ps []*corev1.Pod
			for _, o := range objs {
				if p, ok := o.(*corev1.Pod); ok {
					ps = append(ps, p)
				}
			}
			inputs.Pods.Set(snap, ps)
		}
	}
	if objs, err := list(ctx, client, services.Resource, ""); err != nil {
		missing[inputs.Services.Name()] = err.Error()
	} else {
		var ss []*fix.Service
		for _, o := range objs {
			if s, ok := o.(*corev1.Service); ok {
				ss = append(ss, fix.ServiceFrom(s))
			}
		}
		slices.SortFunc(ss, fix.CompareServices)
		inputs.Services.Set(snap, ss)
	}
	if objs, err := list(ctx, client, endpointslices.Resource, ""); err != nil {
		missing[inputs.EndpointSlices.Name()] = err.Error()
	} else {
		var es []*discoveryv1.EndpointSlice
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				es = append(es, endpointslices.StripEndpointSlice(s))
			}
		}
		inputs.EndpointSlices.Set(snap, es)
	}
	return snap, missing
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
