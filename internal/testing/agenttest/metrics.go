package agenttest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape, by metric name.
type Metrics []Sample

// ParseMetrics parses the Prometheus text format with prometheus/common's expfmt. Histograms and
// summaries become their _bucket/_sum/_count (quantile) samples, as they appear in the text.
func ParseMetrics(text string) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	sort.Strings(names)
	var out Metrics
	for _, n := range names {
		for _, m := range families[n].GetMetric() {
			out = append(out, samples(n, m)...)
		}
	}
	return out, nil
}

// samples flattens one metric of family name into the samples of its text form.
func samples(name string, m *dto.Metric) []Sample {
	labels := func(extra ...string) map[string]string {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	switch {
	case m.Counter != nil:
		return []Sample{{name, labels(), m.GetCounter().GetValue()}}
	case m.Gauge != nil:
		return []Sample{{name, labels(), m.GetGauge().GetValue()}}
	case m.Untyped != nil:
		return []Sample{{name, labels(), m.GetUntyped().GetValue()}}
	case m.Summary != nil:
		var out []Sample
		for _, q := range m.GetSummary().GetQuantile() {
			out = append(out, Sample{name, labels("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue()})
		}
		return append(out, Sample{name + "_sum", labels(), m.GetSummary().GetSampleSum()},
			Sample{name + "_count", labels(), float64(m.GetSummary().GetSampleCount())})
	case m.Histogram != nil:
		var out []Sample
		for _, b := range m.GetHistogram().GetBucket() {
			out = append(out, Sample{name + "_bucket", labels("le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)), float64(b.GetCumulativeCount())})
		}
		out = append(out, Sample{name + "_bucket", labels("le", "+Inf"), float64(m.GetHistogram().GetSampleCount())})
		return append(out, Sample{name + "_sum", labels(), m.GetHistogram().GetSampleSum()},
			Sample{name + "_count", labels(), float64(m.GetHistogram().GetSampleCount())})
	}
	return nil
}

// match reports whether the sample has every label of kv (pairs: name, value).
func (s Sample) match(name string, kv []string) bool {
	if s.Name != name {
		return false
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if s.Labels[kv[i]] != kv[i+1] {
			return false
		}
	}
	return true
}

// Find returns the samples of metric name carrying the given labels (pairs: name, value, ...).
func (m Metrics) Find(name string, labels ...string) []Sample {
	var out []Sample
	for _, s := range m {
		if s.match(name, labels) {
			out = append(out, s)
		}
	}
	return out
}

// Value returns the value of the only sample of name with the given labels; ok is false when there is
// none. With several matching samples it returns their sum.
func (m Metrics) Value(name string, labels ...string) (float64, bool) {
	found := m.Find(name, labels...)
	if len(found) == 0 {
		return 0, false
	}
	return m.Sum(name, labels...), true
}

// Sum adds up the samples of name with the given labels (0 when there are none).
func (m Metrics) Sum(name string, labels ...string) float64 {
	var sum float64
	for _, s := range m.Find(name, labels...) {
		sum += s.Value
	}
	return sum
}

// Lines renders the samples whose name starts with one of prefixes, as exposition lines (sorted
// labels), for logs and the demo.
func (m Metrics) Lines(prefixes ...string) []string {
	var out []string
	for _, s := range m {
		ok := len(prefixes) == 0
		for _, p := range prefixes {
			ok = ok || strings.HasPrefix(s.Name, p)
		}
		if ok {
			out = append(out, s.String())
		}
	}
	return out
}

// String renders the sample as an exposition line with sorted labels.
func (s Sample) String() string {
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(s.Name)
	if len(keys) > 0 {
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(s.Value, 'g', -1, 64))
	return b.String()
}
