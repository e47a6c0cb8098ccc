package agenttest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text exposition format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape, in exposition order.
type Metrics []Sample

// ParseMetrics parses the Prometheus text format (comments are skipped).
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", n+1, line, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, "=\"")
			if eq < 0 {
				return s, fmt.Errorf("bad label")
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for j := 0; j < len(rest); j++ {
				c := rest[j]
				if c == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[j])
					}
					continue
				}
				if c == '"' {
					rest = rest[j+1:]
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value")
			}
			s.Labels[key] = val.String()
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
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
