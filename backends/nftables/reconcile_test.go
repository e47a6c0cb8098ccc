package nftables

import (
	"context"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// apply reconciles rs in Trust mode: what a change-triggered sync does.
func apply(ctx context.Context, b *Backend, rs *rules.Ruleset) error {
	_, err := b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Trust)
	return err
}

// remove reconciles (fix, family) to nothing.
func remove(ctx context.Context, b *Backend, fix string, family rules.Family) error {
	_, err := b.Reconcile(ctx, fix, family, nil, backend.Verify)
	return err
}

// verify runs a Verify reconcile of rs and returns what it did.
func verify(ctx context.Context, b *Backend, rs *rules.Ruleset) (backend.Result, error) {
	return b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Verify)
}

// inSync runs a Verify reconcile of rs (what a periodic resync does) and reports whether it found
// the kernel as recorded, i.e. repaired nothing.
func inSync(ctx context.Context, b *Backend, rs *rules.Ruleset) (bool, error) {
	res, err := verify(ctx, b, rs)
	return !res.Repaired, err
}
