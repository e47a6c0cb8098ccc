package staleudpconntrack

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// subsystem puts the fix's metrics under nnm_stale_udp_conntrack_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	deleted, dumps *prometheus.CounterVec
	errors         *prometheus.CounterVec
}

func newMetrics() *fixMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: metrics.Namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	return &fixMetrics{
		deleted: prometheus.NewCounterVec(opts("deleted_entries_total",
			"UDP conntrack entries deleted because their DNAT target was a pod address no running Pod holds."), []string{"family"}),
		dumps: prometheus.NewCounterVec(opts("dumps_total",
			"Kernel-filtered dumps of the DNAT entries of the conntrack table."), []string{"family"}),
		errors: prometheus.NewCounterVec(opts("errors_total",
			"Failed conntrack dumps or deletions."), []string{"family", "operation"}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.deleted, m.dumps, m.errors}
}
