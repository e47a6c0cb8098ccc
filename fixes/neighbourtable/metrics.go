package neighbourtable

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

var subsystem = metrics.Subsystem(ID)

// fixMetrics reads gc_thresh3 on every scrape (also while the fix is disabled) and exports the last
// decisions.
type fixMetrics struct {
	f                        *Fix
	thresh3, limited, raises *prometheus.Desc
}

func newMetrics(f *Fix) *fixMetrics {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, subsystem, name), help, []string{"family"}, nil)
	}
	return &fixMetrics{f: f,
		thresh3: d("gc_thresh3", "Current net.ipv{4,6}.neigh.default.gc_thresh3 (absent when it cannot be read)."),
		limited: d("limited", "1 when gc_thresh3 would need more than maxThresh3."),
		raises:  d("raises_total", "Raises of the family's thresholds made by the fix since the agent started."),
	}
}

func (m *fixMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.thresh3
	ch <- m.limited
	ch <- m.raises
}

func (m *fixMetrics) Collect(ch chan<- prometheus.Metric) {
	last, raises := m.f.state()
	for _, fam := range rules.Families {
		if v, err := m.f.sys.Get(Thresh(fam, 3)); err == nil {
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				ch <- prometheus.MustNewConstMetric(m.thresh3, prometheus.GaugeValue, n, string(fam))
			}
		}
		limited := 0.0
		if last[fam].Limited {
			limited = 1
		}
		ch <- prometheus.MustNewConstMetric(m.limited, prometheus.GaugeValue, limited, string(fam))
		ch <- prometheus.MustNewConstMetric(m.raises, prometheus.CounterValue, float64(raises[fam]), string(fam))
	}
}
