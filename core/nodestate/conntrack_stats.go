package nodestate

import (
	"context"
	"fmt"

	ct "github.com/ti-mo/conntrack"
)

// Stats are the kernel's connection-tracking statistics of the namespace: the per-CPU counters
// (`conntrack -S`, /proc/net/stat/nf_conntrack) summed over the CPUs, and the table's size.
type ConntrackStats struct {
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

// ConntrackStatsReader reads Stats; NetlinkConntrack is one, tests use a fake.
type ConntrackStatsReader interface {
	Stats(ctx context.Context) (ConntrackStats, error)
}

var _ ConntrackStatsReader = NetlinkConntrack{}

// Stats reads the statistics over ctnetlink (IPCTNL_MSG_CT_GET_STATS_CPU), in the network namespace
// of the calling thread. It only reads. (ti-mo/conntrack's StatsGlobal, IPCTNL_MSG_CT_GET_STATS,
// waited for an answer that did not come on Linux 6.18: the sysctls give the same numbers.)
func (NetlinkConntrack) Stats(ctx context.Context) (ConntrackStats, error) {
	if err := ctx.Err(); err != nil {
		return ConntrackStats{}, err
	}
	c, err := ct.Dial(nil)
	if err != nil {
		return ConntrackStats{}, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	defer c.Close()
	cpus, err := c.Stats()
	if err != nil {
		return ConntrackStats{}, fmt.Errorf("conntrack: read the per-CPU statistics: %w", err)
	}
	var s ConntrackStats
	for _, p := range cpus {
		s.Invalid += uint64(p.Invalid)
		s.InsertFailed += uint64(p.InsertFailed)
		s.Drop += uint64(p.Drop)
		s.EarlyDrop += uint64(p.EarlyDrop)
	}
	s.CPUs = len(cpus)
	return s, nil
}
