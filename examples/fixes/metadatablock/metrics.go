package metadatablock

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rulecounters"
)

// subsystem puts the fix's metrics under nnm_metadata_block_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	dropped *rulecounters.Collector
}

// newMetrics exports the drop rules' kernel counters as nnm_metadata_block_dropped_packets_total,
// monotonic across rule rewrites.
func newMetrics(r rulecounters.Reader) *fixMetrics {
	return &fixMetrics{
		dropped: rulecounters.New(rulecounters.Options{
			Reader: r, Fix: ID,
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "dropped_packets_total",
			Help:  "Packets from this node's pods to a blocked metadata address, dropped.",
			Match: rulecounters.Prefix("dropped-"),
		}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector { return []prometheus.Collector{m.dropped} }
