package nftables

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"
)

// CleanupPlan implements backend.CleanupPlanner: the nnm-* tables Cleanup would delete, in both
// families; nothing is changed.
func (b *Backend) CleanupPlan(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		names, err := b.listTables(ctx, family)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables backend: list %s tables: %w", family, err))
			continue
		}
		sort.Strings(names)
		for _, name := range names {
			if strings.HasPrefix(name, TablePrefix) {
				out = append(out, fmt.Sprintf("nftables: table %s %s", family, name))
			}
		}
	}
	return out, errors.Join(errs...)
}
