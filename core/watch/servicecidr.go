package watch

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/kube"
)

// serviceCIDRGroupVersion serves the ServiceCIDR objects (GA in Kubernetes 1.33).
const serviceCIDRGroupVersion = "networking.k8s.io/v1"

// serviceCIDRWatch is the state of the ServiceCIDR watch: started by Start when a fix needs it,
// decided once discovery answered (served or not), synced once its informer listed.
type serviceCIDRWatch struct {
	started bool // under Informers.mu

	mu      sync.Mutex
	decided bool // discovery answered
	served  bool // the API serves servicecidrs in networking.k8s.io/v1
	store   cache.Store
	synced  cache.InformerSynced
}

// watchServiceCIDRs asks discovery whether the API serves ServiceCIDR objects, retrying with
// backoff while it cannot be asked, then runs their informer or, on an API without them, records
// that the configured serviceCIDRs apply. It returns when ctx ends.
func (s *Informers) watchServiceCIDRs(ctx context.Context, client kube.Interface, h cache.ResourceEventHandler) {
	backoff := 500 * time.Millisecond
	for {
		served, err := servesServiceCIDRs(ctx, client)
		if err == nil {
			s.cidrs.mu.Lock()
			s.cidrs.decided, s.cidrs.served = true, served
			s.cidrs.mu.Unlock()
			if !served {
				s.log.Info("the API server has no ServiceCIDR objects (networking.k8s.io/v1); the configured serviceCIDRs are used")
				s.notify(&s.versions.serviceCIDRs)
				return
			}
			break
		}
		// Requests that got no answer are logged by WrapTransport when the client uses it.
		var uerr *url.Error
		if !s.transportWrapped.Load() || !errors.As(err, &uerr) {
			s.apiErrors.report("discovery "+serviceCIDRGroupVersion, "cannot ask the API server whether it serves ServiceCIDR objects; retrying",
				"groupVersion", serviceCIDRGroupVersion, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	inf := newInformer(client, kube.ServiceCIDRs, "")
	var store cache.Store
	var synced cache.InformerSynced
	if err := s.start(ctx, inf, h, &store, &synced); err != nil {
		s.log.Error("cannot watch ServiceCIDR objects; the configured serviceCIDRs are used", "err", err)
		s.cidrs.mu.Lock()
		s.cidrs.served = false
		s.cidrs.mu.Unlock()
		return
	}
	s.cidrs.mu.Lock()
	s.cidrs.store, s.cidrs.synced = store, synced
	s.cidrs.mu.Unlock()
}

// servesServiceCIDRs reports whether the API serves servicecidrs in networking.k8s.io/v1; an error
// means discovery did not answer (and should be asked again).
func servesServiceCIDRs(ctx context.Context, client kube.Interface) (bool, error) {
	list, err := client.ServerResources(ctx, serviceCIDRGroupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == "servicecidrs" {
			return true, nil
		}
	}
	return false, nil
}

// serviceCIDRsSynced: discovery answered and, where the API serves them, the first list arrived.
func (s *Informers) serviceCIDRsSynced() bool {
	s.cidrs.mu.Lock()
	defer s.cidrs.mu.Unlock()
	return s.cidrs.decided && (!s.cidrs.served || s.cidrs.synced != nil && s.cidrs.synced())
}

// ServiceCIDRs returns the ranges of the cluster's ServiceCIDR objects (sorted, without
// duplicates) and whether the API serves them; served is false before discovery answered, on an
// API without them, and when no fix needs them.
func (s *Informers) ServiceCIDRs() (cidrs []netip.Prefix, served bool) {
	s.cidrs.mu.Lock()
	store, served := s.cidrs.store, s.cidrs.served
	s.cidrs.mu.Unlock()
	if !served || store == nil {
		return nil, false
	}
	for _, o := range store.List() {
		if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
			cidrs = append(cidrs, ParseServiceCIDRs(sc)...)
		}
	}
	slices.SortFunc(cidrs, netip.Prefix.Compare)
	return slices.Compact(cidrs), true
}

// ParseServiceCIDRs returns the parsable ranges of a ServiceCIDR object, masked.
func ParseServiceCIDRs(sc *networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range sc.Spec.CIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// StripServiceCIDR keeps the name and the ranges.
func StripServiceCIDR(sc *networkingv1.ServiceCIDR) *networkingv1.ServiceCIDR {
	out := &networkingv1.ServiceCIDR{}
	out.Name = sc.Name
	out.ResourceVersion = sc.ResourceVersion
	out.Spec.CIDRs = sc.Spec.CIDRs
	return out
}
