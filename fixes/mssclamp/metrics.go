package mssclamp

import "github.com/network-node-manager/network-node-manager/core/metrics"

// synPackets exports the clamp rules' kernel counters as nnm_mss_clamp_syn_packets_total. The kernel
// counters reset when the chain is rewritten; the collector keeps the exported counter monotonic.
func synPackets(r metrics.CounterReader) *metrics.RuleCounters {
	return metrics.NewRuleCounters(metrics.RuleCounterOptions{Reader: r, Fix: ID, Name: "syn_packets_total",
		Help:  "Forwarded TCP SYN and SYN-ACK segments of pod traffic that went through the MSS clamp (their MSS is lowered only where it exceeded the limit).",
		Match: metrics.CounterPrefix("syn-"),
	})
}
