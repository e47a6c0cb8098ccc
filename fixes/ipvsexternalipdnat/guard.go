package ipvsexternalipdnat

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/netaddr"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Skip reasons of the guard: addresses the fix never takes over.
const (
	// ReasonSpecialAddress: the address is in a block of the IANA special-purpose registries that must
	// never be DNATed (loopback, link-local and the cloud metadata address, unspecified, broadcast,
	// multicast, reserved, IPv4-mapped…; see core/netaddr).
	ReasonSpecialAddress = "special-address"
	// ReasonPodCIDR: the address is inside one of this node's pod CIDRs.
	ReasonPodCIDR = "pod-cidr"
	// ReasonNodeAddress: the address is one of this node's own addresses (Node.status.addresses).
	ReasonNodeAddress = "node-address"
	// ReasonNotAllowed: allowedCIDRs is set and contains no range holding the address.
	ReasonNotAllowed = "not-allowed"
)

// guard decides which External-IPs the fix may take over. Anyone who may write a Service's
// status.loadBalancer (or, without an admission policy, spec.externalIPs) chooses the addresses this
// fix DNATs for the node's own traffic; kube-apiserver accepts loopback, link-local, multicast and
// broadcast ingress IPs. The guard refuses the addresses that have a meaning on the node (CVE-2020-8554
// is the same problem for kube-proxy), and narrows the rest to the configured allowedCIDRs.
//
// It is computed once per Rules call from the configuration and the node, so a per-Service result
// computed with it stays valid only while the node's pod CIDRs and addresses and allowedCIDRs stay.
type guard struct {
	allowed   []netip.Prefix // empty: every address the other checks let through
	podCIDRs  []netip.Prefix
	nodeAddrs []netip.Addr
}

func newGuard(cfg Config, snap *fix.Snapshot) guard {
	g := guard{allowed: cfg.allowed, podCIDRs: snap.PodCIDRs}
	if snap.Node != nil {
		for _, na := range snap.Node.Status.Addresses {
			if na.Type != corev1.NodeInternalIP && na.Type != corev1.NodeExternalIP {
				continue
			}
			if a, err := netip.ParseAddr(na.Address); err == nil {
				g.nodeAddrs = append(g.nodeAddrs, a.Unmap().WithZone(""))
			}
		}
	}
	return g
}

// check returns "" when the fix may DNAT raw (as written in the Service, before unmapping), else the
// skip reason and a detail naming the rule that refuses it.
func (g guard) check(raw netip.Addr) (reason, detail string) {
	if b, refused := netaddr.NeverDNAT(raw); refused {
		return ReasonSpecialAddress, fmt.Sprintf("%s is %s (%s, %s), which is never DNATed", raw, b.Name, b.Prefix, b.Ref)
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
	if len(g.allowed) > 0 && !slices.ContainsFunc(g.allowed, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return ReasonNotAllowed, fmt.Sprintf("%s is in no range of fixes.%s.allowedCIDRs", a, ID)
	}
	return "", ""
}

// parseAllowed validates the allowedCIDRs option (rules.ParsePrefixes: CIDRs or single addresses,
// without host bits), none of which may lie wholly in a never-DNAT block (it could never match).
func parseAllowed(list []string) ([]netip.Prefix, error) {
	key := fmt.Sprintf("fixes.%s.allowedCIDRs", ID)
	out, err := rules.ParsePrefixes(key, "", list)
	if err != nil {
		return nil, err
	}
	for _, p := range out {
		if b, ok := netaddr.WithinRefused(p); ok {
			return nil, fmt.Errorf("%s: %s lies within %s (%s), which is never DNATed, so it would allow nothing", key, p, b.Name, b.Prefix)
		}
	}
	return out, nil
}
