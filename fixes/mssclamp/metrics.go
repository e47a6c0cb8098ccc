package mssclamp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rulecounters"
)

// subsystem puts the fix's metrics under nnm_mss_clamp_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	syn *rulecounters.Collector
}

func newMetrics(r rulecounters.Reader) *fixMetrics {
	return &fixMetrics{
		// The kernel counters reset when the chain is rewritten; the collector keeps the exported
		// counter monotonic.
		syn: rulecounters.New(rulecounters.Options{
			Reader: r, Fix: ID,
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "syn_packets_total",
			Help:  "Forwarded TCP SYN and SYN-ACK segments of pod traffic that went through the MSS clamp (their MSS is lowered only where it exceeded the limit).",
			Match: rulecounters.Prefix("syn-"),
		}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector { return []prometheus.Collector{m.syn} }
