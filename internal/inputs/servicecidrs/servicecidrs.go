// Package servicecidrs is the input of the cluster's Service (Cluster-IP) ranges (Table): those of
// the ServiceCIDR objects (networking.k8s.io/v1, GA in Kubernetes 1.33) where the API serves them
// and has any, else the configured serviceCIDRs.
package servicecidrs

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"time"

	"go.uber.org/fx"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Resource is networking.k8s.io/v1 ServiceCIDRs.
var Resource = inputs.Resource{GroupVersion: networkingv1.SchemeGroupVersion, Name: "servicecidrs", Kind: "ServiceCIDR",
	New: func() runtime.Object { return &networkingv1.ServiceCIDR{} }, NewList: func() runtime.Object { return &networkingv1.ServiceCIDRList{} },
	AddToScheme: networkingv1.AddToScheme}

// Module provides the input.
var Module = fx.Module("input-servicecidrs", inputs.Provide(New))

// Input fills Table: it asks discovery whether the API serves ServiceCIDR objects, then runs
// their informer or, on an API without them, takes the configured serviceCIDRs.
type Input struct {
	inputs.Feed
	configured inputs.Configured[[]netip.Prefix]

	mu      sync.Mutex
	started bool
	decided bool // discovery answered
	served  bool // the API serves servicecidrs in networking.k8s.io/v1
}

// New returns the input; it does no I/O.
func New() *Input { return &Input{} }

// Table is Table.
func (in *Input) Table() fix.TableRef { return inputs.ServiceCIDRs }

// Resources are the ServiceCIDRs.
func (in *Input) Resources() []inputs.Resource { return []inputs.Resource{Resource} }

// Configure takes the configured serviceCIDRs (the fallback).
func (in *Input) Configure(s inputs.Settings) {
	in.configured.Set(s.ServiceCIDRs)
}

// Start asks discovery in the background, retrying with backoff while it cannot be asked.
func (in *Input) Start(h inputs.Source) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.started {
		return nil
	}
	if err := h.Go(func(ctx context.Context, api inputs.Discovery) { in.discover(ctx, h, api) }); err != nil {
		return err
	}
	in.started = true
	return nil
}

// discoveryBackoff is the wait between discovery attempts: 0.5 s doubling to 15 s, each wait
// stretched by a random 0-100% (client-go's reflectors jitter theirs alike). Without the jitter
// every agent that started in the same second (a rollout, nodes rebooting while the API server is
// down) asked again in the same 100 ms, for as long as the API server did not answer (the fleet
// benchmark in BENCHMARKS.md).
func discoveryBackoff() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: 15 * time.Second}
}

func (in *Input) discover(ctx context.Context, h inputs.Source, api inputs.Discovery) {
	backoff := discoveryBackoff()
	for {
		served, err := serves(ctx, api)
		if err == nil {
			in.mu.Lock()
			in.decided, in.served = true, served
			in.mu.Unlock()
			if !served {
				h.Log().Info("the API server has no ServiceCIDR objects (networking.k8s.io/v1); the configured serviceCIDRs are used")
				in.Moved(h)
				return
			}
			break
		}
		// Requests that got no answer are logged by WrapTransport when the client uses it.
		var uerr *url.Error
		if !h.TransportLogs() || !errors.As(err, &uerr) {
			h.ReportAPIError("discovery "+Resource.GroupVersion.String(), "cannot ask the API server whether it serves ServiceCIDR objects; retrying",
				"groupVersion", Resource.GroupVersion.String(), "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Step()):
		}
	}
	if err := in.Watch(h, Resource, "", transform, nil); err != nil {
		h.Log().Error("cannot watch ServiceCIDR objects; the configured serviceCIDRs are used", "err", err)
		in.mu.Lock()
		in.served = false
		in.mu.Unlock()
		in.Moved(h)
	}
}

// serves reports whether the API serves servicecidrs in networking.k8s.io/v1; an error means
// discovery did not answer (and should be asked again).
func serves(ctx context.Context, api inputs.Discovery) (bool, error) {
	list, err := api.ServerResources(ctx, Resource.GroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == Resource.Name {
			return true, nil
		}
	}
	return false, nil
}

// Synced: discovery answered and, where the API serves them, the first list arrived.
func (in *Input) Synced() error {
	in.mu.Lock()
	started, decided, served := in.started, in.decided, in.served
	in.mu.Unlock()
	switch {
	case !started:
		return errors.New(inputs.ServiceCIDRs.Name() + " (not started)")
	case !decided:
		return errors.New(inputs.ServiceCIDRs.Name())
	case !served:
		return nil
	}
	return in.Feed.Synced(inputs.ServiceCIDRs.Name())
}

// Revision moves with the objects' and the configuration's.
func (in *Input) Revision() uint64 { return in.Feed.Revision() + in.configured.Revision() }

// Value is the ranges ([]netip.Prefix): the objects' when the API serves them and has any, else
// the configured ones.
func (in *Input) Value() any {
	in.mu.Lock()
	served := in.served
	in.mu.Unlock()
	if served {
		if cidrs := in.fromObjects(); len(cidrs) > 0 {
			return cidrs
		}
	}
	return in.configured.Get()
}

func (in *Input) fromObjects() []netip.Prefix {
	store := in.Store()
	if store == nil {
		return nil
	}
	var cidrs []netip.Prefix
	for _, o := range store.List() {
		if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
			cidrs = append(cidrs, Parse(sc)...)
		}
	}
	slices.SortFunc(cidrs, netip.Prefix.Compare)
	return slices.Compact(cidrs)
}

// Parse returns the parsable ranges of a ServiceCIDR object, masked.
func Parse(sc *networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range sc.Spec.CIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

func transform(obj any) (any, error) {
	if sc, ok := obj.(*networkingv1.ServiceCIDR); ok {
		out := &networkingv1.ServiceCIDR{}
		out.Name, out.ResourceVersion, out.Spec.CIDRs = sc.Name, sc.ResourceVersion, sc.Spec.CIDRs
		return out, nil
	}
	return obj, nil
}
