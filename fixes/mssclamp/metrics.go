package mssclamp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/rulecounters"
)

type metrics struct {
	syn *rulecounters.Collector
}

func newMetrics(r rulecounters.Reader) *metrics {
	return &metrics{
		// The kernel counters reset when the chain is rewritten; the collector keeps the exported
		// counter monotonic.
		syn: rulecounters.New(rulecounters.Options{
			Reader: r, Fix: ID,
			Name:  "nnm_mss_clamp_syn_packets_total",
			Help:  "Forwarded TCP SYN and SYN-ACK segments of pod traffic that went through the MSS clamp (their MSS is lowered only where it exceeded the limit).",
			Match: rulecounters.Prefix("syn-"),
		}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error { return reg.Register(m.syn) }
