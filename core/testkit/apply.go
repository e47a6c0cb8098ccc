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

// Change makes b hold rs trusting its record (backend.Trust): what a change-triggered sync does.
func Change(ctx context.Context, b backend.Backend, rs *rules.Ruleset) error {
	_, err := b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Trust)
	return err
}

// Verify runs a Verify reconcile of rs (what a periodic resync does) and returns what it did.
func Verify(ctx context.Context, b backend.Backend, rs *rules.Ruleset) (backend.Result, error) {
	return b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Verify)
}

// InSync runs Verify and reports whether it found the kernel as recorded (repaired nothing).
func InSync(ctx context.Context, b backend.Backend, rs *rules.Ruleset) (bool, error) {
	res, err := Verify(ctx, b, rs)
	return !res.Repaired, err
}
