// Package invaliddrop drops packets that conntrack marks INVALID before the node answers them with a
// TCP RST that kills a healthy masqueraded connection (kubernetes#74839, #117924).
package invaliddrop

import "github.com/network-node-manager/network-node-manager/core/fix"

// ID is the fix id: config key fixes.invalid-drop, metric label, log field, rule comments.
const ID = "invalid-drop"

// Module registers the fix.
var Module = fix.Module(spec, New)

var spec = fix.Spec[Config, settings]{
	ID:          ID,
	Description: "drop packets conntrack marks INVALID so the node never answers them with a connection-killing RST (kubernetes#74839)",
	Default:     func() Config { return Config{Hooks: []string{"input"}} },
	Parse:       parse,
	// On in every kube-proxy mode: iptables mode drops INVALID in FORWARD only, IPVS and nftables
	// modes not at all, and the node's INPUT path is where the RST comes from. It needs no watch:
	// the rules do not depend on the cluster.
	DefaultEnabled: func(fix.Env) bool { return true },
	// The predecessor's variable (Kakao network-node-manager).
	LegacyEnabledEnv: "RULE_DROP_INVALID_INPUT_ENABLE",
}

// Config is the fix's configuration (keys under fixes.invalid-drop).
type Config struct {
	// Hooks the drop is installed in: input (the RST problem) and/or forward.
	Hooks []string `mapstructure:"hooks"`
	// Protocols limits the drop to these protocols (tcp, udp, sctp); empty means all packets.
	Protocols []string `mapstructure:"protocols"`
	// ExemptSourceCIDRs are sources whose INVALID packets are let through (e.g. asymmetric routes).
	ExemptSourceCIDRs []string `mapstructure:"exemptSourceCIDRs"`
}
