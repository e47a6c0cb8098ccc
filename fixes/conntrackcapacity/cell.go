// Package conntrackcapacity raises net.netfilter.nf_conntrack_max (and the conntrack hash table's
// buckets) when the table's fill or its drop and early_drop counters say it is too small, up to a
// bound derived from the node's memory: new flows, DNS included, are otherwise dropped silently
// once the table is full (kubernetes#18604, #71261). kube-proxy sizes the table once, at its start,
// from conntrack.maxPerCore; the fix never goes below that, nor below anything an operator or
// another agent set.
package conntrackcapacity

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
)

// ID is the fix id: config key fixes.conntrack-capacity, metric label, log field.
const ID = "conntrack-capacity"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default (the table's size is a policy: memory against dropped flows). It reads
// nothing from the Kubernetes API: the node's memory, CPUs and conntrack table are read on the node.
var spec = fix.Spec[Config, Settings]{
	ID:          ID,
	Description: "raise nf_conntrack_max and the conntrack hash size when the table fills or drops connections, up to a bound from the node's memory (kubernetes#18604)",
	Default: func() Config {
		return Config{RaiseAt: 0.75, TargetFill: 0.5, MaxMemoryPercent: 5, KubeProxyMaxPerCore: 32768, KubeProxyMin: 131072, StateDir: fix.StateDir}
	},
	Parse: parse,
}

// Config is the fix's configuration (keys under fixes.conntrack-capacity).
type Config struct {
	// RaiseAt is the fill (entries / nf_conntrack_max) at which the table is raised.
	RaiseAt float64 `mapstructure:"raiseAt"`
	// TargetFill is the fill a raise aims at: nf_conntrack_max becomes entries / TargetFill.
	TargetFill float64 `mapstructure:"targetFill"`
	// MaxMemoryPercent bounds the table: at most this share of the node's memory in entries
	// (EntryBytes each).
	MaxMemoryPercent float64 `mapstructure:"maxMemoryPercent"`
	// KubeProxyMaxPerCore and KubeProxyMin are kube-proxy's conntrack.maxPerCore and conntrack.min
	// (its defaults): what kube-proxy sets at its start, which the fix never goes below. 0 per core:
	// kube-proxy leaves the table alone.
	KubeProxyMaxPerCore int `mapstructure:"kubeProxyMaxPerCore"`
	KubeProxyMin        int `mapstructure:"kubeProxyMin"`
	// StateDir holds conntrack-capacity.json, the values to restore when the fix is disabled.
	// Empty keeps them in memory only (lost on restart).
	StateDir string `mapstructure:"stateDir"`
}
