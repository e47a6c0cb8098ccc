// Package mssclamp lowers the MSS option of forwarded TCP SYN and SYN-ACK segments of pod traffic to
// what the route can carry, so that pods behind a narrower link (VXLAN, IPIP, WireGuard) do not hit a
// path-MTU black hole when ICMP "fragmentation needed" is filtered on the way (Calico #7651).
package mssclamp

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// ID is the fix id: config key fixes.mss-clamp, metric label, log field, rule comments.
const ID = "mss-clamp"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default (whether a node needs the clamp depends on its links and on filters
// elsewhere on the path, which the agent cannot see); it reads the Node, for its pod CIDRs. The
// default configuration, the zero Config, clamps to the path MTU, scoped to the node's pod CIDRs.
var spec = fix.Spec[Config, Config]{
	ID:          ID,
	Description: "clamp the TCP MSS of forwarded pod SYN and SYN-ACK segments to the route's MTU so large transfers do not stall in a PMTU black hole (Calico #7651)",
	Parse:       parse,
	Reads:       []fix.TableRef{inputs.PodCIDRs},
}

// Config is the fix's configuration (keys under fixes.mss-clamp).
type Config struct {
	// MSS is a fixed MSS to clamp to; 0 clamps to the path MTU of the segment's route.
	MSS int `mapstructure:"mss"`
	// PodInterfacePrefix, when set, scopes the clamp to segments entering or leaving interfaces with
	// this name prefix (e.g. "cali", "veth") instead of the node's pod CIDRs.
	PodInterfacePrefix string `mapstructure:"podInterfacePrefix"`
}
