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
	dead           prometheus.Gauge
	heldBack       *prometheus.GaugeVec
	waiting        prometheus.Gauge
}

func newMetrics() *fixMetrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: metrics.Namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	return &fixMetrics{
		deleted: prometheus.NewCounterVec(opts("deleted_entries_total",
			"UDP conntrack entries deleted because their DNAT target was an address that a Pod of this node gave up."), []string{"family"}),
		dumps: prometheus.NewCounterVec(opts("dumps_total",
			"Kernel-filtered (UDP, DNAT) dumps of the conntrack table."), []string{"family"}),
		errors: prometheus.NewCounterVec(opts("errors_total",
			"Failed conntrack dumps or deletions."), []string{"family", "operation"}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metrics.Namespace, Subsystem: subsystem, Name: "dead_addresses",
			Help: "Addresses that a Pod of this node gave up, remembered for the retention; only entries DNATed to them are deleted."}),
		heldBack: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: metrics.Namespace, Subsystem: subsystem, Name: "held_back_addresses",
			Help: "Dead addresses whose entries the last pass did not judge, by reason: pod-waiting, a Pod of this node was waiting for a pod address (within pendingGrace) and the address was given up less than pendingGrace before."}, []string{"reason"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metrics.Namespace, Subsystem: subsystem, Name: "waiting_pods",
			Help: "Pods of this node without a pod address for less than pendingGrace at the last pass: while there is one, the addresses given up less than pendingGrace before are held back."}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.deleted, m.dumps, m.errors, m.dead, m.heldBack, m.waiting}
}
