package externalipdnat

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	services *prometheus.GaugeVec
	ips      *prometheus.GaugeVec
}

func newMetrics() *metrics {
	return &metrics{
		services: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nnm_externalip_dnat_services",
			Help: "Services with External-IPs of the family: covered = got at least one DNAT entry, skipped = had at least one address or port left out (see logs for the reason).",
		}, []string{"family", "state"}),
		ips: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nnm_externalip_dnat_ips",
			Help: "Distinct External-IPs of the family that are DNATed to a Cluster-IP.",
		}, []string{"family"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.services, m.ips} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
