package conntrackcapacity

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

var subsystem = metrics.Subsystem(ID)

// fixMetrics reads nf_conntrack_max on every scrape (also while the fix is disabled) and exports the
// last decision.
type fixMetrics struct {
	f                           *Fix
	max, bound, limited, raises *prometheus.Desc
}

func newMetrics(f *Fix) *fixMetrics {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, subsystem, name), help, nil, nil)
	}
	return &fixMetrics{f: f,
		max:     d("max_entries", "Current net.netfilter.nf_conntrack_max (absent when it cannot be read)."),
		bound:   d("bound_entries", "The most entries the fix raises nf_conntrack_max to (maxMemoryPercent of the node's memory); absent before its first pass."),
		limited: d("limited", "1 when the table needs more entries than the bound allows."),
		raises:  d("raises_total", "Raises of nf_conntrack_max made by the fix since the agent started."),
	}
}

func (m *fixMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.max
	ch <- m.bound
	ch <- m.limited
	ch <- m.raises
}

func (m *fixMetrics) Collect(ch chan<- prometheus.Metric) {
	if v, err := m.f.sys.Get(Max); err == nil {
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(m.max, prometheus.GaugeValue, n)
		}
	}
	d, raises := m.f.state()
	if d.Bound > 0 {
		ch <- prometheus.MustNewConstMetric(m.bound, prometheus.GaugeValue, float64(d.Bound))
	}
	limited := 0.0
	if d.Limited {
		limited = 1
	}
	ch <- prometheus.MustNewConstMetric(m.limited, prometheus.GaugeValue, limited)
	ch <- prometheus.MustNewConstMetric(m.raises, prometheus.CounterValue, float64(raises))
}
