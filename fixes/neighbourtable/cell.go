// Package neighbourtable raises the neighbour (ARP, NDP) tables' garbage-collection thresholds
// (net.ipv{4,6}.neigh.default.gc_thresh1/2/3) when the entries approach gc_thresh3 or the kernel
// reports the table full: past gc_thresh3 the kernel refuses new neighbours ("neighbour table
// overflow") and the packets to them are dropped. The table is global across network namespaces, so
// a node with many pods talking to many peers on a big flat network hits the kernel's defaults
// (128/512/1,024) early (kops#4533, kubespray#8825); OpenShift ships 8,192/32,768/65,536.
package neighbourtable

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
)

// ID is the fix id: config key fixes.neighbour-table, metric label, log field.
const ID = "neighbour-table"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default (a bigger table costs kernel memory). It reads nothing from the Kubernetes
// API: the tables' entries and counters are read on the node.
var spec = fix.Spec[Config, Settings]{
	ID:          ID,
	Description: "raise net.ipv4/ipv6.neigh.default.gc_thresh1/2/3 when the neighbour table approaches gc_thresh3 or overflows (kops#4533)",
	Default: func() Config {
		return Config{RaiseAt: 0.8, TargetFill: 0.5, MaxThresh3: 65536, StateDir: fix.StateDir}
	},
	Parse: parse,
}

// Config is the fix's configuration (keys under fixes.neighbour-table).
type Config struct {
	// RaiseAt is the share of gc_thresh3 the entries reach before the thresholds are raised.
	RaiseAt float64 `mapstructure:"raiseAt"`
	// TargetFill is the share of gc_thresh3 a raise aims at: gc_thresh3 becomes entries / TargetFill.
	TargetFill float64 `mapstructure:"targetFill"`
	// MaxThresh3 bounds gc_thresh3 (OpenShift's 65,536 by default: about 25 MiB of entries).
	MaxThresh3 int `mapstructure:"maxThresh3"`
	// StateDir holds neighbour-table.json, the values to restore when the fix is disabled. Empty
	// keeps them in memory only (lost on restart).
	StateDir string `mapstructure:"stateDir"`
}
