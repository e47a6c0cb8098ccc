package invaliddrop

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/rulecounters"
)

type metrics struct {
	redundant prometheus.Gauge
	dropped   *rulecounters.Collector
}

func newMetrics(r rulecounters.Reader) *metrics {
	return &metrics{
		redundant: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nnm_invalid_drop_redundant",
			Help: "1 when net.netfilter.nf_conntrack_tcp_be_liberal=1 makes the INVALID drop redundant, else 0.",
		}),
		// The kernel counters reset when the chains are rewritten; the collector keeps the exported
		// counter monotonic.
		dropped: rulecounters.New(rulecounters.Options{
			Reader: r, Fix: ID,
			Name:  "nnm_invalid_drop_dropped_packets_total",
			Help:  "Packets dropped because conntrack marked them INVALID, summed over hooks and protocols.",
			Match: rulecounters.Prefix("dropped"),
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if err := reg.Register(m.redundant); err != nil {
		return err
	}
	return reg.Register(m.dropped)
}
