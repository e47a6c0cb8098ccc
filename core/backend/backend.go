// Package backend defines the interface through which the core programs rules into the kernel.
//
// A backend owns a namespace of kernel objects (iptables chains named "NNM-…"; nftables tables named
// "nnm-<fix>", one per fix and family) and never touches anything else, except the jump rules it adds
// to built-in iptables chains. Each call is about one fix and one family, so fixes never disturb each other.
package backend

import (
	"context"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Counter is a packet/byte counter read from the kernel.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// Backend renders rulesets and applies them to the kernel.
type Backend interface {
	// Name is "iptables" or "nftables"; it labels metrics.
	Name() string
	// Render returns exactly the input the backend would feed its kernel tool to make the kernel hold rs
	// (iptables-restore or nft -f text), touching nothing. Used by `plan` and golden tests.
	Render(rs *rules.Ruleset) (string, error)
	// Apply makes the kernel hold exactly rs for (rs.Fix, rs.Family) in one atomic step; objects of this
	// fix that rs no longer has are removed. On error the previous state of the fix stays in place.
	Apply(ctx context.Context, rs *rules.Ruleset) error
	// InSync reports whether the kernel still holds what the last successful Apply of (fix, family) put
	// there. False when nothing was applied yet in this process or someone changed or deleted our objects.
	InSync(ctx context.Context, fix string, family rules.Family) (bool, error)
	// Remove deletes everything of fix in family. Removing what is not there is not an error.
	Remove(ctx context.Context, fix string, family rules.Family) error
	// Counters reads the named counters (Rule.Counter) of fix in family.
	Counters(ctx context.Context, fix string, family rules.Family) (map[string]Counter, error)
	// Cleanup removes everything the backend owns in every family, whatever fix put it there.
	Cleanup(ctx context.Context) error
}
