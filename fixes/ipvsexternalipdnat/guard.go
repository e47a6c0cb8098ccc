package ipvsexternalipdnat

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Skip reasons of the guard: addresses the fix never takes over.
const (
	// ReasonSpecialAddress: the address is in a block of the IANA special-purpose registries that must
	// never be DNATed (loopback, link-local, unspecified, broadcast, multicast, reserved, IPv4-mapped…;
	// see rules.NeverDNAT), or an IPv6 form (NAT64, 6to4, Teredo) that carries such an IPv4 address.
	ReasonSpecialAddress = "special-address"
	// ReasonCloudMetadata: the address is a cloud metadata endpoint (rules.MetadataAddrs), or an IPv6
	// form that carries one.
	ReasonCloudMetadata = "cloud-metadata"
	// ReasonPodCIDR: the address is inside one of this node's pod CIDRs.
	ReasonPodCIDR = "pod-cidr"
	// ReasonNodeAddress: the address is one of this node's own addresses (Node.status.addresses).
	ReasonNodeAddress = "node-address"
	// ReasonServiceCIDR: the address is inside one of the cluster's Service CIDRs, where Cluster-IPs
	// are allocated (kube-dns's, the API's, any other Service's).
	ReasonServiceCIDR = "service-cidr"
	// ReasonClusterIP: the address is the Cluster-IP of a Service (outside the known Service CIDRs).
	ReasonClusterIP = "cluster-ip"
	// ReasonNotAllowed: allowedCIDRs is set and contains no range holding the address.
	ReasonNotAllowed = "not-allowed"
	// ReasonSpecExternalIP: the address comes from spec.externalIPs and specExternalIPs is false.
	ReasonSpecExternalIP = "spec-external-ip"
)

// guard decides which External-IPs the fix may take over. Anyone who may write a Service's
// status.loadBalancer, and anyone who may create a Service when specExternalIPs is on, chooses the
// addresses this fix DNATs for the node's own traffic; kube-apiserver accepts loopback, link-local,
// multicast and broadcast ingress IPs, and another Service's Cluster-IP as an external IP. The guard
// refuses the addresses that have a meaning on the node or in the cluster (CVE-2020-8554 is the same
// problem for kube-proxy), and narrows the rest to the configured allowedCIDRs.
//
// It is made once per Rules call from the configuration, the node and the cluster's Service ranges
// (Fix.guardFor keeps the previous one while they stay), so a per-Service result computed with it
// stays valid only while those stay.
type guard struct {
	allowed      []netip.Prefix // empty: every address the other checks let through
	spec         bool           // take spec.externalIPs over
	podCIDRs     []netip.Prefix
	nodeAddrs    []netip.Addr
	serviceCIDRs []netip.Prefix
	// clusterIPs are the Cluster-IPs of Services that lie outside serviceCIDRs (sorted; normally
	// none, so that a new Service does not change the guard), with the Service each belongs to.
	clusterIPs []rules.MapEntry
}

func newGuard(cfg Config, snap *fix.Snapshot, clusterIPs []rules.MapEntry) guard {
	g := guard{allowed: cfg.allowed, spec: cfg.SpecExternalIPs, podCIDRs: inputs.PodCIDRs.Get(snap), serviceCIDRs: inputs.ServiceCIDRs.Get(snap)}
	if inputs.Node.Get(snap) != nil {
		for _, na := range inputs.Node.Get(snap).Status.Addresses {
			if na.Type != corev1.NodeInternalIP && na.Type != corev1.NodeExternalIP {
				continue
			}
			if a, err := netip.ParseAddr(na.Address); err == nil {
				g.nodeAddrs = append(g.nodeAddrs, a.Unmap().WithZone(""))
			}
		}
	}
	g.clusterIPs = clusterIPs
	return g
}

// same reports whether g and o decide alike.
func (g *guard) same(o *guard) bool {
	return slices.Equal(g.allowed, o.allowed) && g.spec == o.spec && slices.Equal(g.podCIDRs, o.podCIDRs) &&
		slices.Equal(g.nodeAddrs, o.nodeAddrs) && slices.Equal(g.serviceCIDRs, o.serviceCIDRs) &&
		slices.EqualFunc(g.clusterIPs, o.clusterIPs, func(a, b rules.MapEntry) bool { return a.Addr == b.Addr && a.Comment == b.Comment })
}

func (g *guard) inServiceCIDRs(a netip.Addr) netip.Prefix {
	for _, p := range g.serviceCIDRs {
		if p.Contains(a) {
			return p
		}
	}
	return netip.Prefix{}
}

// check returns "" when the fix may DNAT raw (as written in the Service, before unmapping), else the
// skip reason and a detail naming the rule that refuses it.
func (g *guard) check(raw netip.Addr) (reason, detail string) {
	if r, refused := rules.NeverDNAT(raw); refused {
		reason := ReasonSpecialAddress
		if r.Metadata {
			reason = ReasonCloudMetadata
		}
		return reason, fmt.Sprintf("%s %s: never DNATed", raw, r)
	}
	a := raw.Unmap()
	if slices.Contains(g.nodeAddrs, a) {
		return ReasonNodeAddress, fmt.Sprintf("%s is an address of this node (Node.status.addresses), which is never DNATed", a)
	}
	for _, p := range g.podCIDRs {
		if p.Contains(a) {
			return ReasonPodCIDR, fmt.Sprintf("%s is inside this node's pod CIDR %s, which is never DNATed", a, p)
		}
	}
	if p := g.inServiceCIDRs(a); p.IsValid() {
		return ReasonServiceCIDR, fmt.Sprintf("%s is inside the cluster's Service CIDR %s, where Cluster-IPs are allocated: taking it over would redirect another Service's traffic (e.g. DNS), so it is never DNATed", a, p)
	}
	if i, ok := slices.BinarySearchFunc(g.clusterIPs, a, func(e rules.MapEntry, a netip.Addr) int { return e.Addr.Compare(a) }); ok {
		return ReasonClusterIP, fmt.Sprintf("%s is the Cluster-IP of %s: taking it over would redirect that Service's traffic, so it is never DNATed", a, g.clusterIPs[i].Comment)
	}
	if len(g.allowed) > 0 && !slices.ContainsFunc(g.allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return ReasonNotAllowed, fmt.Sprintf("%s is in no range of fixes.%s.allowedCIDRs", a, ID)
	}
	return "", ""
}

// clusterIPEntries is the per-Service function of Fix.clusterIPs: one pseudo entry per Cluster-IP of
// family that lies outside the Service CIDRs (normally none: a Cluster-IP inside them is refused by
// the range already), commented with the Service's name, so that fix.ServiceMap keeps them sorted
// and up to date without recomputing unchanged Services. The entries never reach a backend.
func clusterIPEntries(svc *fix.Service, family rules.Family, cidrs *cidrSet) ([]rules.MapEntry, []fix.Skip) {
	var out []rules.MapEntry
	for _, a := range svc.ClusterIPs {
		if a = a.Unmap(); family.Contains(a) && !cidrs.contains(a) {
			out = append(out, rules.MapEntry{Addr: a, Protocol: rules.TCP, Comment: svc.Key()})
		}
	}
	return out, nil
}

// cidrSet is the input of Fix.clusterIPs: the Service CIDRs. Fix.guardFor hands out the same
// pointer while they stay, so that fix.ServiceMap recomputes no Service.
type cidrSet struct{ prefixes []netip.Prefix }

func (c *cidrSet) contains(a netip.Addr) bool {
	return slices.ContainsFunc(c.prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
}

// parseAllowed validates the allowedCIDRs option (rules.ParsePrefixes: CIDRs or single addresses,
// without host bits), none of which may lie wholly in a never-DNAT block (it could never match).
func parseAllowed(list []string) ([]netip.Prefix, error) {
	const key = "allowedCIDRs"
	out, err := rules.ParsePrefixes(key, "", list)
	if err != nil {
		return nil, fix.OptionErr(key, err)
	}
	for _, p := range out {
		if b, ok := rules.WithinRefused(p); ok {
			return nil, fix.Invalid(key, "%s lies within %s (%s), which is never DNATed, so it would allow nothing", p, b.Name, b.Prefix)
		}
	}
	return out, nil
}
