package conntrack

import (
	"context"
	"fmt"

	ct "github.com/ti-mo/conntrack"
)

// Stats are the kernel's connection-tracking statistics of the namespace: the per-CPU counters
// (`conntrack -S`, /proc/net/stat/nf_conntrack) summed over the CPUs, and the table's size.
type Stats struct {
	// Invalid counts packets conntrack could not track (marked INVALID): among them out-of-window
	// TCP segments, the start of kubernetes#74839.
	Invalid uint64
	// InsertFailed counts entries that lost a race to be inserted (the packet was dropped unless
	// the clash was resolved); Drop, packets dropped because the table was full; EarlyDrop, entries
	// evicted to make room.
	InsertFailed, Drop, EarlyDrop uint64
	// CPUs is how many per-CPU records were summed.
	CPUs int
}

// StatsReader reads Stats; Netlink is one, tests use a fake.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

var _ StatsReader = Netlink{}

// Stats reads the statistics over ctnetlink (IPCTNL_MSG_CT_GET_STATS_CPU), in the network namespace
// of the calling thread. It only reads. (ti-mo/conntrack's StatsGlobal, IPCTNL_MSG_CT_GET_STATS,
// waited for an answer that did not come on Linux 6.18: the sysctls give the same numbers.)
func (Netlink) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	c, err := ct.Dial(nil)
	if err != nil {
		return Stats{}, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	defer c.Close()
	cpus, err := c.Stats()
	if err != nil {
		return Stats{}, fmt.Errorf("conntrack: read the per-CPU statistics: %w", err)
	}
	var s Stats
	for _, p := range cpus {
		s.Invalid += uint64(p.Invalid)
		s.InsertFailed += uint64(p.InsertFailed)
		s.Drop += uint64(p.Drop)
		s.EarlyDrop += uint64(p.EarlyDrop)
	}
	s.CPUs = len(cpus)
	return s, nil
}
