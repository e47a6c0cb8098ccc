package ipvsexternalipdnat

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// subsystem puts the fix's metrics under nnm_ipvs_externalip_dnat_.
var subsystem = metrics.Subsystem(ID)

type fixMetrics struct {
	services *prometheus.GaugeVec
	ips      *prometheus.GaugeVec
}

func newMetrics() *fixMetrics {
	return &fixMetrics{
		services: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "services",
			Help: "Services with External-IPs of the family: covered = got at least one DNAT entry, skipped = had at least one address or port left out (see logs for the reason).",
		}, []string{"family", "state"}),
		ips: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Subsystem: subsystem, Name: "ips",
			Help: "Distinct External-IPs of the family that are DNATed to a Cluster-IP.",
		}, []string{"family"}),
	}
}

func (m *fixMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.services, m.ips}
}
