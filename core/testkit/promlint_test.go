package testkit

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPromlintReportsBadNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nnm_dropped_packets", Help: "no _total suffix"})
	reg.MustRegister(c)
	c.Inc()
	r := &recorder{TB: t}
	Promlint(r, reg)
	if !r.failed || !strings.Contains(r.msg, "nnm_dropped_packets") {
		t.Fatalf("a counter without _total must be reported, got %q", r.msg)
	}
	good := prometheus.NewRegistry()
	g := prometheus.NewCounter(prometheus.CounterOpts{Name: "nnm_dropped_packets_total", Help: "fine"})
	good.MustRegister(g)
	g.Inc()
	r = &recorder{TB: t}
	Promlint(r, good)
	if r.failed {
		t.Fatalf("a well-named counter was reported: %q", r.msg)
	}
}
