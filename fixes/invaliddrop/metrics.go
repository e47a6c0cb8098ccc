package invaliddrop

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rulecounters"
)

// subsystem puts the fix's metrics under nnm_invalid_drop_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	redundant prometheus.Gauge
	dropped   *rulecounters.Collector
}

func newMetrics(r rulecounters.Reader) *fixMetrics {
	return &fixMetrics{
		redundant: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "redundant",
			Help: "1 when net.netfilter.nf_conntrack_tcp_be_liberal=1 makes the INVALID drop redundant, else 0.",
		}),
		// The kernel counters reset when the chains are rewritten; the collector keeps the exported
		// counter monotonic.
		dropped: rulecounters.New(rulecounters.Options{
			Reader: r, Fix: ID,
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "dropped_packets_total",
			Help:  "Packets dropped because conntrack marked them INVALID, summed over hooks and protocols.",
			Match: rulecounters.Prefix("dropped"),
		}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.redundant, m.dropped}
}
