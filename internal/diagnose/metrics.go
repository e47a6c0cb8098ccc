package diagnose

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// Metrics exports the last Report of the running agent: nnm_diagnosis_state{check,state} is 1 for
// each check's state and 0 for its other states (one series per check and state), and
// nnm_diagnosis_last_run_timestamp_seconds says when the checks last ran.
type Metrics struct {
	state *prometheus.Desc
	last  *prometheus.Desc

	mu     sync.Mutex
	report *Report
	at     float64
}

// NewMetrics registers the metrics on reg; they are empty until Set.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		state: prometheus.NewDesc(metrics.Namespace+"_diagnosis_state",
			"The state of each diagnose check on this node (1 for its state, 0 for the others): ok, problem (no enabled fix handles it), handled (by an enabled fix), cannot-tell.",
			[]string{"check", "state"}, nil),
		last: prometheus.NewDesc(metrics.Namespace+"_diagnosis_last_run_timestamp_seconds",
			"When the diagnose checks last ran in the agent (Unix seconds).", nil, nil),
	}
	return m, reg.Register(m)
}

// Set makes r the exported report, run at unix time at.
func (m *Metrics) Set(r *Report, at float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report, m.at = r, at
}

// Last is the last report set (nil before the first run).
func (m *Metrics) Last() *Report {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.report
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.state; ch <- m.last }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.report == nil {
		return
	}
	for _, f := range m.report.Findings {
		for _, s := range States {
			v := 0.0
			if f.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, v, f.Check, string(s))
		}
	}
	ch <- prometheus.MustNewConstMetric(m.last, prometheus.GaugeValue, m.at)
}
