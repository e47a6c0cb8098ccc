package metadatablock

import "github.com/network-node-manager/network-node-manager/core/metrics"

// droppedPackets exports the drop rules' kernel counters as nnm_metadata_block_dropped_packets_total
// (rulecounters names it after the fix id), monotonic across rule rewrites.
func droppedPackets(r metrics.CounterReader) *metrics.RuleCounters {
	return metrics.NewRuleCounters(metrics.RuleCounterOptions{Reader: r, Fix: ID, Name: "dropped_packets_total",
		Help:  "Packets from this node's pods to a blocked metadata address, dropped.",
		Match: metrics.CounterPrefix("dropped-"),
	})
}
