package testkit

import (
	"context"
	"errors"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Apply makes b hold rs for (rs.Fix, rs.Family), checking the kernel first (backend.Verify): what a
// test means by "program this ruleset".
func Apply(ctx context.Context, b backend.Backend, rs *rules.Ruleset) error {
	if rs == nil {
		return errors.New("testkit.Apply: nil ruleset (use Remove)")
	}
	_, err := b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Verify)
	return err
}

// Remove makes b hold nothing of fix in family.
func Remove(ctx context.Context, b backend.Backend, fix string, family rules.Family) error {
	_, err := b.Reconcile(ctx, fix, family, nil, backend.Verify)
	return err
}
