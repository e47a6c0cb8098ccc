package nftables

import (
	"context"
	"fmt"
)

// CleanupPlan implements backend.CleanupPlanner: the nnm-* tables Cleanup would delete, in both
// families; nothing is changed.
func (b *Ops) CleanupPlan(ctx context.Context) ([]string, error) {
	keys, err := b.ownTables(ctx)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("nftables: table %s %s", k.family, k.table))
	}
	return out, err
}
