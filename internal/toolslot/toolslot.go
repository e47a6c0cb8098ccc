// Package toolslot admits one netfilter dump or restore process at a time in the agent process:
// iptables-save, iptables-nft-restore (with --noflush it first fetches the tables it
// changes) and the diagnosis's and detection's saves each hold a family's tables in their own memory,
// and the agent's memory cgroup is charged for all of them. With 10,000 entries programmed, a
// restore beside a save took the hostile-Services run (BENCHMARKS.md, row H) to 125 MiB of the
// DaemonSet's 128Mi; the backend's own token did not see the diagnosis's save. One slot for the
// process, so that every caller waits for every other.
package toolslot

import (
	"context"
	"fmt"
)

var slot = make(chan struct{}, 1)

// Acquire waits for the slot and returns its release, or ctx's cause while waiting; what names the
// tool in that error (e.g. "iptables-nft-save").
func Acquire(ctx context.Context, what string) (release func(), err error) {
	select {
	case slot <- struct{}{}:
		return func() { <-slot }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for another iptables-save or -restore of the agent to finish: %w", what, context.Cause(ctx))
	}
}
