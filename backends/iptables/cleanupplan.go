package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// cleanupMatch selects the chains Cleanup deletes: ours and the predecessor's.
func cleanupMatch(c string) bool { return isOurs(c) || strings.HasPrefix(c, PredecessorChainPrefix) }

// CleanupPlan implements backend.CleanupPlanner: the chains Cleanup would delete, in both families
// and every table, from one iptables-save each (two where there is something to delete); nothing is changed.
func (b *Backend) CleanupPlan(ctx context.Context) ([]string, error) {
	var out []string
	var errs []error
	for _, f := range rules.Families {
		d, err := b.dumpDeclaring(ctx, f, cleanupMatch)
		if err != nil {
			errs = append(errs, err)
		}
		if d == nil {
			continue
		}
		for _, t := range d.tables {
			for _, c := range t.chains {
				if !c.builtin() && cleanupMatch(c.name) {
					out = append(out, fmt.Sprintf("%s: table %s chain %s and the rules jumping to it", b.Binary(f, ""), t.name, c.name))
				}
			}
		}
	}
	return out, errors.Join(errs...)
}
