// Package ipvsexternalipdnat makes a Service's External-IPs reachable from the node itself in kube-proxy
// IPVS mode: traffic that starts on this node (pods or host network) and is addressed to an External-IP
// is DNATed to the Service's Cluster-IP, which IPVS serves on every node (kubernetes#75262).
package ipvsexternalipdnat

import (
	"net/netip"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
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
	Default:        func() Config { return Config{FromPods: true, FromHost: true} },
	Parse:          validate,
	Reads:          []fix.TableRef{inputs.Services, inputs.Node, inputs.PodCIDRs, inputs.ServiceCIDRs},
	DefaultEnabled: func(env fix.Env) bool { return env.ProxyMode == "ipvs" },
	// The predecessor's variable (Kakao network-node-manager).
	LegacyEnabledEnv: "RULE_EXTERNAL_CLUSTER_ENABLE",
}

// Config is the fix's configuration (keys under fixes.ipvs-externalip-dnat).
type Config struct {
	// MasqueradeMark is deprecated and ignored (a warning is logged when it is set): the fix used to
	// mark what it DNATed with this bit and masquerade every packet carrying it, whoever set it; it
	// now masquerades the connections it DNATed, found by conntrack, and touches no mark. Still
	// accepted so that an existing configuration keeps working.
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
