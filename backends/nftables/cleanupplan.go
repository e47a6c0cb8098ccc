package nftables

import (
	"context"
	"fmt"
)

// CleanupPlan implements backend.CleanupPlanner: the nnm-* tables Cleanup would delete, in both
// families; nothing is changed.
func (b *Ops) CleanupPlan(ctx context.Context) ([]string, error) {
	tables, err := b.ownTables(ctx)
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		line := fmt.Sprintf("nftables: table %s %s", t.family, t.table)
		if t.earlier {
			line += " (made by an earlier version: no owner comment)"
		}
		out = append(out, line)
	}
	return out, err
}
