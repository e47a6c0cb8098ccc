package conntrackliberal

import (
	"strconv"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// subsystem puts the fix's metrics under nnm_conntrack_liberal_.
var subsystem = metrics.Subsystem(ID)

// fixMetrics reads the sysctl on every scrape, so the value is current even while the fix is
// disabled (e.g. to see that kube-proxy's --conntrack-tcp-be-liberal set it).
type fixMetrics struct {
	f        *Fix
	value    *prometheus.Desc
	previous *prometheus.Desc
}

func newMetrics(f *Fix) *fixMetrics {
	return &fixMetrics{
		f: f,
		value: prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, subsystem, "value"),
			"Current value of net.netfilter.nf_conntrack_tcp_be_liberal (absent when it cannot be read).", nil, nil),
		previous: prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, subsystem, "previous_value"),
			"Value the fix restores when it is disabled (absent when nothing is owed).", nil, nil),
	}
}

func (m *fixMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.value
	ch <- m.previous
}

func (m *fixMetrics) Collect(ch chan<- prometheus.Metric) {
	if v, err := m.f.sys.Get(nodestate.ConntrackTCPBeLiberal); err == nil {
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(m.value, prometheus.GaugeValue, n)
		}
	}
	if p, ok := m.f.previous(); ok {
		if n, err := strconv.ParseFloat(p, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(m.previous, prometheus.GaugeValue, n)
		}
	}
}
