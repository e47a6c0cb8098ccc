// Package ipvsexternalipdnat makes a Service's External-IPs reachable from the node itself in kube-proxy
// IPVS mode: traffic that starts on this node (pods or host network) and is addressed to an External-IP
// is DNATed to the Service's Cluster-IP, which IPVS serves on every node (kubernetes#75262).
package ipvsexternalipdnat

import (
	"net/netip"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs/node"
	"github.com/network-node-manager/network-node-manager/core/inputs/servicecidrs"
	"github.com/network-node-manager/network-node-manager/core/inputs/services"
)

// ID is the fix id: config key fixes.ipvs-externalip-dnat, metric label, log field, rule comments.
const ID = "ipvs-externalip-dnat"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: on by default only in kube-proxy IPVS mode, the only mode that still has the problem (Check
// refuses the others); it reads Services, this Node (for its pod CIDRs and addresses) and the
// Service CIDRs.
var spec = fix.Spec[Config, Config]{
	ID:             ID,
	Description:    "IPVS mode: DNAT node-local traffic for Service External-IPs to the Cluster-IP so eTP=Local Services stay reachable from the node (kubernetes#75262)",
	Default:        func() Config { return Config{MasqueradeMark: DefaultMasqueradeMark, FromPods: true, FromHost: true} },
	Parse:          validate,
	Reads:          []fix.TableRef{services.Table, node.Table, node.PodCIDRs, servicecidrs.Table},
	DefaultEnabled: func(env fix.Env) bool { return env.ProxyMode == "ipvs" },
}

// DefaultMasqueradeMark is the packet-mark bit this fix uses to masquerade what it DNATed. It is our
// own bit, not kube-proxy's 0x4000, so the fix depends on nothing kube-proxy owns.
const DefaultMasqueradeMark uint32 = 0x00001000

// kubeProxyMarks are the mark bits kube-proxy sets (its --iptables-masquerade-bit 14 default and
// KUBE-MARK-DROP's bit 15, in iptables and IPVS mode): a masqueradeMark on one of them would
// masquerade, or be masqueraded by, traffic that is not ours.
var kubeProxyMarks = map[uint32]string{
	0x00004000: "kube-proxy's masquerade bit (KUBE-MARK-MASQ, --iptables-masquerade-bit=14)",
	0x00008000: "kube-proxy's drop bit (KUBE-MARK-DROP)",
}

// Config is the fix's configuration (keys under fixes.ipvs-externalip-dnat).
type Config struct {
	// MasqueradeMark is the single mark bit set on DNATed packets and masqueraded in postrouting. It
	// must be this fix's alone: the fix also clears it on the traffic it sees (from pods, from the
	// host) and does not DNAT.
	MasqueradeMark uint32 `mapstructure:"masqueradeMark"`
	// FromPods catches traffic of local pods in prerouting (source in this node's pod CIDRs, or from
	// an interface starting with PodInterfacePrefix).
	FromPods bool `mapstructure:"fromPods"`
	// FromHost catches host-network traffic in output (source address type LOCAL).
	FromHost bool `mapstructure:"fromHost"`
	// PodInterfacePrefix, when set, also catches traffic entering from interfaces with this name
	// prefix (e.g. "cali", "veth"): for CNIs without per-node pod CIDRs.
	PodInterfacePrefix string `mapstructure:"podInterfacePrefix"`
	// AllowedCIDRs, when not empty, are the only ranges whose External-IPs the fix takes over (both
	// families: a family without a range gets no entry). Addresses that are never DNATed (special-
	// purpose blocks, this node's pod CIDRs and addresses) stay refused whatever it says.
	AllowedCIDRs []string `mapstructure:"allowedCIDRs"`
	// SpecExternalIPs also takes over the addresses of spec.externalIPs, which anyone who may create
	// a Service in any namespace sets (CVE-2020-8554); off by default, when only
	// status.loadBalancer.ingress (written by the load-balancer controller) counts, as with the
	// predecessor.
	SpecExternalIPs bool `mapstructure:"specExternalIPs"`

	allowed []netip.Prefix // AllowedCIDRs parsed by validate
}
