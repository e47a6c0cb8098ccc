// Package staleudpconntrack deletes UDP conntrack entries that still send a client's packets to a pod
// address that a Pod of this node held and gave up: a hostPort/portmap (or NodePort) DNAT entry
// outlives its target and every packet of a fixed-source-port client refreshes it
// (kubernetes#58336, containernetworking/plugins#1190).
package staleudpconntrack

import (
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// ID is the fix id: config key fixes.stale-udp-conntrack, metric label, log field.
const ID = "stale-udp-conntrack"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default (deleting conntrack entries is a policy the operator chooses). It reads this
// node's Pods: which addresses they hold, and which they gave up; the engine runs the fix only once
// that watch has synced.
var spec = fix.Spec[Config, Config]{
	ID:          ID,
	Description: "delete UDP conntrack entries DNATed to an address that a Pod of this node gave up, so fixed-port UDP clients reach the new pod (kubernetes#58336)",
	Default: func() Config {
		return Config{MaxDeletesPerPass: 1000, MinDumpInterval: 200 * time.Millisecond, Retention: 5 * time.Minute, PendingGrace: 2 * time.Minute}
	},
	Parse: parse,
	Reads: []fix.TableRef{inputs.Pods},
}

// Config is the fix's configuration (keys under fixes.stale-udp-conntrack).
type Config struct {
	// MaxDeletesPerPass bounds the entries deleted in one pass, per family; what is left is deleted
	// in the next passes (which then follow without waiting for a change).
	MaxDeletesPerPass int `mapstructure:"maxDeletesPerPass"`
	// MinDumpInterval is the shortest time between two dumps of the conntrack table of a family.
	MinDumpInterval time.Duration `mapstructure:"minDumpInterval"`
	// Retention is how long an address that a Pod of this node gave up stays known dead (entries
	// DNATed to it are deleted meanwhile).
	Retention time.Duration `mapstructure:"retention"`
	// PendingGrace bounds how long a Pod of this node without a pod address holds back every
	// deletion (it may have been given a dead address that its status does not show yet); 0 holds
	// nothing back.
	PendingGrace time.Duration `mapstructure:"pendingGrace"`
}
