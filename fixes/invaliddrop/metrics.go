package invaliddrop

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// subsystem puts the fix's metrics under nnm_invalid_drop_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	redundant prometheus.GaugeFunc
	dropped   *metrics.RuleCounters
}

// newMetrics takes the counters' reader and a function that reports whether the drop is redundant
// now. The gauge is read at scrape time: it describes the sysctl, which another fix (conntrack-liberal)
// or the operator may change at any moment, so a value stored at the last sync could be stale.
func newMetrics(r metrics.CounterReader, redundant func() bool) *fixMetrics {
	return &fixMetrics{
		redundant: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "redundant",
			Help: "1 when net.netfilter.nf_conntrack_tcp_be_liberal=1 makes the INVALID drop redundant, else 0.",
		}, func() float64 {
			if redundant() {
				return 1
			}
			return 0
		}),
		// The kernel counters reset when the chains are rewritten; the collector keeps the exported
		// counter monotonic.
		dropped: metrics.NewRuleCounters(metrics.RuleCounterOptions{
			Reader: r, Fix: ID,
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "dropped_packets_total",
			Help:  "Packets dropped because conntrack marked them INVALID, summed over hooks and protocols.",
			Match: metrics.CounterPrefix("dropped"),
		}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.redundant, m.dropped}
}
