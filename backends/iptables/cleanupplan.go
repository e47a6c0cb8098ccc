package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// cleanupMatch selects the chains Cleanup may delete by name, ours and the predecessor's: what the
// first scan of iptables-save looks for (a chain must also pass removable).
func cleanupMatch(c string) bool { return isOurs(c) || strings.HasPrefix(c, PredecessorChainPrefix) }

// removable is the chains of d that cleanup deletes among those match names: the predecessor's
// NMANAGER_ chains by name (they were never marked), and an NNM- chain only when we made it, that is
// when a jump commented network-node-manager:<fix> in a built-in chain leads to it (dump.owners): an
// NNM- chain of someone else's stays (issue #41 row 10; the nftables backend marks its tables with
// a comment). A chain of ours whose jump someone deleted is left too.
func removable(d *dump, match func(string) bool) map[tchain]bool {
	own := d.owners()
	gone := map[tchain]bool{}
	for _, t := range d.tables {
		for _, c := range t.chains {
			k := tchain{t.name, c.name}
			if c.builtin() || !match(c.name) {
				continue
			}
			if _, marked := own[k]; marked || !isOurs(c.name) {
				gone[k] = true
			}
		}
	}
	return gone
}

// CleanupPlan implements backend.CleanupPlanner: the chains Cleanup would delete, in both families
// and every table, from one iptables-save each (two where there is something to delete); nothing is changed.
func (b *Ops) CleanupPlan(ctx context.Context) ([]string, error) {
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
		gone := removable(d, cleanupMatch)
		for _, t := range d.tables {
			for _, c := range t.chains {
				if gone[tchain{t.name, c.name}] {
					out = append(out, fmt.Sprintf("%s: table %s chain %s and the rules jumping to it", b.Binary(f, ""), t.name, c.name))
				}
			}
		}
	}
	return out, errors.Join(errs...)
}
