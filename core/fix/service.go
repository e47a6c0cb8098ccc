package fix

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
)

// Service is what fixes read about a Kubernetes Service, in a compact form of our own: the watch
// turns every Service into one as it arrives (the informer cache holds this form, not the
// corev1.Service), so that 10,000 Services cost a few hundred bytes each (BENCHMARKS.md, "Memory
// (#21)"). Addresses are parsed once, here; values that thousands of Services share (the namespace,
// port names, protocols) point to one copy each.
//
// A Service is never modified once made: a changed Service is a new *Service (ServiceMap relies on
// it). Make one with ServiceFrom.
type Service struct {
	Namespace string
	Name      string
	// ResourceVersion is the object's metadata.resourceVersion. Fixes have no use for it; the
	// watch's cache tells updates from resyncs by it.
	ResourceVersion string
	Type            ServiceType
	// Headless: spec.clusterIP is "None" (ClusterIPs is then empty).
	Headless bool
	// LocalTrafficPolicy: spec.externalTrafficPolicy is Local.
	LocalTrafficPolicy bool
	// ClusterIPs are spec.clusterIPs (spec.clusterIP when that is empty), primary first.
	ClusterIPs []netip.Addr
	// ExternalIPs are spec.externalIPs.
	ExternalIPs []netip.Addr
	// Ingress are the status.loadBalancer.ingress entries that have an IP (hostname-only entries
	// are left out).
	Ingress []Ingress
	Ports   []ServicePort
	// Invalid are the addresses of those fields that are not IP addresses (or carry a zone), with
	// the field they are in. The API server validates these fields, so only Services from a file
	// (`plan`) and tests have any; a fix reports them.
	Invalid []InvalidAddr
	// Oversized are the lists of the object longer than MaxHeldPerService (spec.ports,
	// spec.externalIPs, status.loadBalancer.ingress), with their lengths. Such a list is not held
	// (its field above is empty): the API accepts 30,000 ports in one Service, which would be 1.2 MB
	// held per Service for as long as it exists. A fix that would make entries from the Service
	// skips it (OversizedSkip).
	Oversized []Oversized
}

// MaxHeldPerService is the most items of one list of a Service (its ports, its external
// addresses of one field) that ServiceFrom keeps: with more, the Service wants more than
// MaxEntriesPerService entries for any address or port of the other list, so no fix may program
// it, and holding the list would only let one tenant's objects fill the agent's memory.
const MaxHeldPerService = MaxEntriesPerService

// Oversized is one list of a Service that ServiceFrom did not keep.
type Oversized struct {
	Field string // as the API names it: spec.ports
	Len   int
}

// OversizedSkip is the Skip of a Service with an Oversized list (false when it has none): over the
// service budget, the field and its length named.
func (s *Service) OversizedSkip() (Skip, bool) {
	if len(s.Oversized) == 0 {
		return Skip{}, false
	}
	var what []string
	for _, o := range s.Oversized {
		what = append(what, fmt.Sprintf("%s has %d items", o.Field, o.Len))
	}
	return Skip{Reason: ReasonServiceBudget, Detail: fmt.Sprintf("%s, more than the %d the agent holds of one Service (fix.MaxHeldPerService): it would want more entries than one Service may have, and none of them is programmed",
		strings.Join(what, ", "), MaxHeldPerService)}, true
}

// held returns list, or nil (recording it in s.Oversized) when it is longer than MaxHeldPerService.
func held[T any](s *Service, field string, list []T) []T {
	if len(list) > MaxHeldPerService {
		s.Oversized = append(s.Oversized, Oversized{Field: field, Len: len(list)})
		return nil
	}
	return list
}

// ServiceType is spec.type.
type ServiceType uint8

// The Service types. A Service without a type is a ClusterIP Service, as the API server defaults it.
const (
	ServiceTypeClusterIP ServiceType = iota
	ServiceTypeNodePort
	ServiceTypeLoadBalancer
	ServiceTypeExternalName
)

var serviceTypes = []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort,
	corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}

// String is the type as the API spells it.
func (t ServiceType) String() string {
	if int(t) < len(serviceTypes) {
		return string(serviceTypes[t])
	}
	return fmt.Sprintf("ServiceType(%d)", t)
}

// Ingress is one load-balancer ingress address.
type Ingress struct {
	IP netip.Addr
	// Proxy: ipMode is Proxy (traffic must go through the load balancer).
	Proxy bool
}

// ServicePort is one entry of spec.ports.
type ServicePort struct {
	Name     string
	Protocol corev1.Protocol // "" means TCP, as the API server defaults it
	Port     int32
	// NodePort is the port on every node (0: none; a NodePort or LoadBalancer Service has one).
	NodePort int32
}

// InvalidAddr is a field value that is not an IP address.
type InvalidAddr struct {
	// Field names it as the API does: spec.clusterIPs[0], status.loadBalancer.ingress[1].ip,
	// spec.externalIPs[2].
	Field string
	Value string
}

// Key is "namespace/name".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// CompareServices orders Services by namespace/name (the order of Snapshot.Services).
func CompareServices(a, b *Service) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// ServiceFrom returns the compact form of svc (which it does not keep).
func ServiceFrom(svc *corev1.Service) *Service {
	out := &Service{
		Namespace:          intern(svc.Namespace),
		Name:               svc.Name,
		ResourceVersion:    svc.ResourceVersion,
		Type:               ServiceTypeClusterIP,
		LocalTrafficPolicy: svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
	}
	if i := slices.Index(serviceTypes, svc.Spec.Type); i > 0 {
		out.Type = ServiceType(i)
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) > 0 && clusterIPs[0] == corev1.ClusterIPNone {
		out.Headless, clusterIPs = true, nil
	}
	out.ClusterIPs = out.parseAll("spec.clusterIPs", held(out, "spec.clusterIPs", clusterIPs))
	out.ExternalIPs = out.parseAll("spec.externalIPs", held(out, "spec.externalIPs", svc.Spec.ExternalIPs))
	for i, ing := range held(out, "status.loadBalancer.ingress", svc.Status.LoadBalancer.Ingress) {
		if ing.IP == "" {
			continue
		}
		if a, ok := out.parse(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), ing.IP); ok {
			proxy := ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy
			out.Ingress = append(out.Ingress, Ingress{IP: a, Proxy: proxy})
		}
	}
	out.Ingress = slices.Clip(out.Ingress)
	if ports := held(out, "spec.ports", svc.Spec.Ports); len(ports) > 0 {
		out.Ports = make([]ServicePort, len(ports))
		for i, p := range ports {
			out.Ports[i] = ServicePort{Name: intern(p.Name), Protocol: intern(p.Protocol), Port: p.Port, NodePort: p.NodePort}
		}
	}
	return out
}

// parseAll parses the addresses of field, keeping those that do not parse in Invalid.
func (s *Service) parseAll(field string, list []string) []netip.Addr {
	var out []netip.Addr
	for i, v := range list {
		if a, ok := s.parse(fmt.Sprintf("%s[%d]", field, i), v); ok {
			out = append(out, a)
		}
	}
	return slices.Clip(out)
}

// parse parses one address as written (an IPv4-mapped IPv6 address stays one); an address with a
// zone is invalid.
func (s *Service) parse(field, v string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSpace(v))
	if err != nil || a.Zone() != "" {
		s.Invalid = append(s.Invalid, InvalidAddr{Field: field, Value: v})
		return netip.Addr{}, false
	}
	return a, true
}

// intern returns the one shared copy of a short value many Services repeat.
func intern[S ~string](s S) S {
	if s == "" || len(s) > 64 {
		return s
	}
	return S(unique.Make(string(s)).Value())
}
