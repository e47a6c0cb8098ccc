package testkit

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// recorder is a testing.TB that records errors instead of failing.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.errs = append(r.errs, fmt.Sprintf(f, a...)) }

func TestPromlintReportsBadNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nnm_dropped_packets", Help: "no _total suffix"})
	reg.MustRegister(c)
	c.Inc()
	r := &recorder{TB: t}
	Promlint(r, reg)
	if len(r.errs) == 0 || !strings.Contains(strings.Join(r.errs, "\n"), "nnm_dropped_packets") {
		t.Fatalf("a counter without _total must be reported, got %v", r.errs)
	}
	good := prometheus.NewRegistry()
	g := prometheus.NewCounter(prometheus.CounterOpts{Name: "nnm_dropped_packets_total", Help: "fine"})
	good.MustRegister(g)
	g.Inc()
	r = &recorder{TB: t}
	Promlint(r, good)
	if len(r.errs) != 0 {
		t.Fatalf("a well-named counter was reported: %v", r.errs)
	}
}
