// Package inputs is the input side of the SDK: the tables fixes read (Services, Node, PodCIDRs,
// Pods, ServiceCIDRs, EndpointSlices), and the contract an input module keeps to fill a table
// (Input), with what the agent's runtime lends it (Source: informers on the agent's one API client,
// this node's name, the change signal) and the helpers most inputs are made of (Feed, Configured).
//
// An input is written against this package only, so it can live outside this repository
// (examples/inputs/namespacelabels): it declares its table (fix.NewTable), a Resource, and an Input
// whose Start asks the Source for an informer; its Module joins the agent with Provide. The
// informer plumbing (client, rate-limited error logs, the file of objects `plan` reads) is the
// runtime's.
package inputs

import (
	"context"
	"log/slog"
	"net/netip"

	"go.uber.org/fx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// Input is what an input module provides (the fx group "inputs", see Provide): one table, filled
// through a Source, with a revision and the Source's change signal.
type Input interface {
	// Table is the table it fills.
	Table() fix.TableRef
	// Start begins filling the table through s; later calls do nothing. It does not block: the
	// runtime ends what it started when it stops. An error means the table cannot be filled (no
	// API client).
	Start(s Source) error
	// Synced returns nil once the table holds its first complete state (a fix must not act on a
	// partial one), else why not.
	Synced() error
	// Revision moves after every change that Value shows, and after Start and Configure: read it
	// before Value, and the value is at least that new.
	Revision() uint64
	// Value returns the table's current contents, of the table's type. Callers must not modify it.
	Value() any
}

// Source is what the runtime lends an input to fill its table.
type Source interface {
	// NodeName is this node's name, "" when not configured (an input of this node's objects then
	// cannot watch).
	NodeName() string
	// Log is the agent's logger.
	Log() *slog.Logger
	// Informer runs an informer of r (only the objects fieldSelector selects) until the agent
	// stops: transform makes what its cache holds of each object (nil: the object as it is), and
	// handler hears every change, after the cache has it. It returns the cache and whether the
	// handler has seen the first list.
	Informer(r Resource, fieldSelector string, transform cache.TransformFunc,
		handler cache.ResourceEventHandler) (cache.Store, cache.InformerSynced, error)
	// Go runs f in the background until the agent stops, with a context that ends then and the
	// API's discovery (e.g. to decide whether an informer can run).
	Go(f func(ctx context.Context, api Discovery)) error
	// Changed signals that some table changed; the input has moved its revision before.
	Changed()
	// ReportAPIError logs an API error under key, rate-limited per key.
	ReportAPIError(key, msg string, args ...any)
	// TransportLogs reports whether requests that got no answer at all are already logged by the
	// client (an input then leaves them out of ReportAPIError).
	TransportLogs() bool
}

// Discovery is the API discovery an input may ask.
type Discovery interface {
	// ServerResources is discovery of one group version ("networking.k8s.io/v1"): a NotFound
	// error when the API does not serve it.
	ServerResources(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error)
}

// Resource is a kind of object an input lists and watches: an input module declares its own (the
// set is open), and the runtime's client makes a REST client of its group version when it is first
// watched.
type Resource struct {
	// GroupVersion is the API group version that serves it ("v1", "discovery.k8s.io/v1").
	GroupVersion schema.GroupVersion
	// Name is the resource's plural name in URLs ("services").
	Name string
	// Kind is the object's kind ("Service"), as in YAML documents.
	Kind string
	// Namespaced: its objects live in namespaces (Services, Pods), not cluster-wide (Nodes).
	Namespaced bool
	// New returns an empty object; NewList an empty list of them.
	New, NewList func() runtime.Object
	// AddToScheme registers the group version's types (the API package's AddToScheme).
	AddToScheme func(*runtime.Scheme) error
}

func (r Resource) String() string { return r.Name }

// GroupVersionResource is the resource's group, version and name.
func (r Resource) GroupVersionResource() schema.GroupVersionResource {
	return r.GroupVersion.WithResource(r.Name)
}

// Watcher is implemented by inputs that list objects of the API: the resources they watch, whose
// kinds a file for `plan` may hold (and that RBAC must grant).
type Watcher interface {
	Resources() []Resource
}

// Settings are the agent-wide values from the configuration that inputs may fall back on, already
// validated.
type Settings struct {
	// PodCIDRs is the configured podCIDRs (for a Node without spec.podCIDRs).
	PodCIDRs []netip.Prefix
	// ServiceCIDRs is the configured serviceCIDRs (for an API without ServiceCIDR objects).
	ServiceCIDRs []netip.Prefix
}

// Configurable is implemented by inputs that read the agent's configuration (a configured
// fallback). The runtime calls Configure before the first Start and after every accepted reload.
type Configurable interface {
	Configure(s Settings)
}

// Provide registers an input module's constructor: its Input joins the "inputs" group.
//
//	var Module = fx.Module("input-namespace-labels", inputs.Provide(New))
func Provide(newInput any) fx.Option {
	return fx.Provide(fx.Annotate(newInput, fx.As(new(Input)), fx.ResultTags(`group:"inputs"`)))
}

// Group is embedded by constructors that receive every registered input.
type Group struct {
	fx.In
	Inputs []Input `group:"inputs"`
}
