package nodeportreservedports

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

var subsystem = metrics.Subsystem(ID)

// fixMetrics exports the last decision: the NodePorts inside the ephemeral range, and how many of
// them ip_local_reserved_ports left open before the fix's pass.
type fixMetrics struct {
	f             *Fix
	overlap, open *prometheus.Desc
}

func newMetrics(f *Fix) *fixMetrics {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, subsystem, name), help, nil, nil)
	}
	return &fixMetrics{f: f,
		overlap: d("overlap_ports", "NodePorts (the range, or those in use) inside the ephemeral port range: the ports the fix keeps reserved."),
		open:    d("open_ports", "Of those, the ports ip_local_reserved_ports did not hold when the fix last looked (it then reserved them)."),
	}
}

func (m *fixMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.overlap
	ch <- m.open
}

func (m *fixMetrics) Collect(ch chan<- prometheus.Metric) {
	d := m.f.state()
	ch <- prometheus.MustNewConstMetric(m.overlap, prometheus.GaugeValue, float64(Count(d.Overlap)))
	ch <- prometheus.MustNewConstMetric(m.open, prometheus.GaugeValue, float64(Count(d.Open)))
}
