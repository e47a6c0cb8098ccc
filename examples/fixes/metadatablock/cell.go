// Package metadatablock is an example fix written outside the network-node-manager module, as a
// third party would write one: it drops traffic from this node's pods to cloud metadata addresses
// (169.254.169.254 by default), so that pods cannot read the node's cloud credentials, while the node
// itself (kubelet, host-network pods) keeps its access.
//
// Files: cell.go (id, spec, config, module), metadatablock.go (the rules), metrics.go, the tests, and
// README.md in the sections every fix README has. See CONTRIBUTING.md at the repository root.
package metadatablock

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// ID is the fix id: config key fixes.metadata-block, metric label, log field, rule comments.
const ID = "metadata-block"

// Module registers the fix: one line in a custom agent's fx.Options.
var Module = fix.Module(spec, New)

// spec declares the fix to the core. It is off by default (blocking is a policy choice the cluster
// owner makes) and reads the Node, for its pod CIDRs (the table inputs.PodCIDRs).
var spec = fix.Spec[Config, settings]{
	ID:          ID,
	Description: "drop traffic from this node's pods to cloud metadata addresses (169.254.169.254), keeping the node's own access",
	Default:     func() Config { return Config{Addresses: []string{"169.254.169.254"}} },
	Parse:       parse,
	Reads:       []fix.TableRef{inputs.PodCIDRs},
}

// Config is the fix's configuration (keys under fixes.metadata-block).
type Config struct {
	// Addresses are the metadata addresses to block, IPv4 and/or IPv6.
	Addresses []string `mapstructure:"addresses"`
	// ExemptSourceCIDRs are pod ranges allowed through (e.g. a metadata proxy's pods).
	ExemptSourceCIDRs []string `mapstructure:"exemptSourceCIDRs"`
}
