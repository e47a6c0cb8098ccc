package testkit

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSeriesAndValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nnm_t_total", Help: "t."}, []string{"family", "op"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "nnm_t_gauge", Help: "g."})
	reg.MustRegister(v, g)
	if got := Series(t, reg, "nnm_t_total"); got != "" {
		t.Errorf("a vector without series: %q, want nothing", got)
	}
	v.WithLabelValues("ipv6", "dump").Add(2)
	v.WithLabelValues("ipv4", "dump").Inc()
	g.Set(3.5)
	if got, want := Series(t, reg, "nnm_t_total"), `{family="ipv4",op="dump"} 1`+"\n"+`{family="ipv6",op="dump"} 2`; got != want {
		t.Errorf("Series = %q, want %q", got, want)
	}
	if got := Series(t, reg, "nnm_t_gauge"); got != "3.5" {
		t.Errorf("Series of a gauge without labels = %q, want 3.5", got)
	}
	if got, ok := Value(t, reg, "nnm_t_total", "family", "ipv6"); !ok || got != 2 {
		t.Errorf("Value(family=ipv6) = %v, %v; want 2", got, ok)
	}
	if _, ok := Value(t, reg, "nnm_t_total", "family", "ipv9"); ok {
		t.Error("Value found a series that does not exist")
	}
}

func TestLogBufferLines(t *testing.T) {
	var l LogBuffer
	if got := l.Lines(); got != nil {
		t.Errorf("Lines of an empty buffer = %q, want nil", got)
	}
	fmt.Fprintln(&l, "level=INFO msg=a")
	fmt.Fprintln(&l, "level=WARN msg=b")
	if got := l.Lines(); !slices.Equal(got, []string{"level=INFO msg=a", "level=WARN msg=b"}) {
		t.Errorf("Lines = %q, want the two lines without line ends", got)
	}
}
