package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

func TestMonotonicAcrossRewrites(t *testing.T) {
	be := testkit.NewFakeBackend()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewRuleCounters(metrics.RuleCounterOptions{Reader: be, Fix: "demo-fix", Name: "dropped_packets_total",
		Help: "Dropped.", Match: metrics.CounterPrefix("dropped")}))
	want := func(v4, v6 string) {
		t.Helper()
		exp := "# HELP nnm_demo_fix_dropped_packets_total Dropped.\n# TYPE nnm_demo_fix_dropped_packets_total counter\n"
		if v4 != "" {
			exp += `nnm_demo_fix_dropped_packets_total{family="ipv4"} ` + v4 + "\n"
		}
		if v6 != "" {
			exp += `nnm_demo_fix_dropped_packets_total{family="ipv6"} ` + v6 + "\n"
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(exp)); err != nil {
			t.Error(err)
		}
	}
	rs := func(fam rules.Family) *rules.Ruleset {
		return &rules.Ruleset{Fix: "demo-fix", Family: fam, Chains: []rules.Chain{{Name: "X", Type: rules.Filter, Hook: rules.Input, Rules: []rules.Rule{
			{Match: rules.Match{Protocol: rules.TCP}, Verdict: rules.Verdict{Kind: rules.Drop}, Counter: "dropped-tcp"},
			{Match: rules.Match{Protocol: rules.UDP}, Verdict: rules.Verdict{Kind: rules.Drop}, Counter: "dropped-udp"},
			{Verdict: rules.Verdict{Kind: rules.Accept}, Counter: "accepted"},
		}}}}
	}
	ctx := context.Background()
	set := func(fam rules.Family, name string, n uint64) {
		t.Helper()
		if err := be.SetCounter("demo-fix", fam, name, backend.Counter{Packets: n, Bytes: 100 * n}); err != nil {
			t.Fatal(err)
		}
	}
	want("", "") // nothing applied: nothing exported
	if err := testkit.Apply(ctx, be, rs(rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	set(rules.IPv4, "dropped-tcp", 5)
	set(rules.IPv4, "dropped-udp", 2)
	set(rules.IPv4, "accepted", 1000) // not matched
	want("7", "")
	set(rules.IPv4, "dropped-tcp", 8)
	want("10", "")
	if err := testkit.Apply(ctx, be, rs(rules.IPv4)); err != nil { // rewrite: kernel counters reset
		t.Fatal(err)
	}
	want("10", "")
	set(rules.IPv4, "dropped-tcp", 1)
	want("11", "")
	be.SetCountersError(context.DeadlineExceeded)
	want("11", "")
	be.SetCountersError(nil)
	if err := testkit.Apply(ctx, be, rs(rules.IPv6)); err != nil {
		t.Fatal(err)
	}
	set(rules.IPv6, "dropped-udp", 3)
	want("11", "3")
}

func TestBytes(t *testing.T) {
	be := testkit.NewFakeBackend()
	c := metrics.NewRuleCounters(metrics.RuleCounterOptions{Reader: be, Fix: "demo-fix", Name: "bytes_total", Help: "Bytes.", Bytes: true})
	if err := testkit.Apply(context.Background(), be, &rules.Ruleset{Fix: "demo-fix", Family: rules.IPv4, Chains: []rules.Chain{{Name: "X", Type: rules.Filter, Hook: rules.Input,
		Rules: []rules.Rule{{Verdict: rules.Verdict{Kind: rules.Drop}, Counter: "any"}}}}}); err != nil {
		t.Fatal(err)
	}
	_ = be.SetCounter("demo-fix", rules.IPv4, "any", backend.Counter{Packets: 2, Bytes: 120})
	if v := testutil.ToFloat64(c); v != 120 {
		t.Fatalf("bytes = %v", v)
	}
}

// slowReader answers every family after delay, or fails when its context ends first.
type slowReader struct{ delay time.Duration }

func (r slowReader) Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error) {
	select {
	case <-time.After(r.delay):
		return map[string]backend.Counter{"dropped": {Packets: 1}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Each family has the whole Timeout: reads that fit it one by one are all exported, even when
// together they take longer (under load a slow first family once froze the second's series).
func TestTimeoutPerFamily(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewRuleCounters(metrics.RuleCounterOptions{Reader: slowReader{delay: 60 * time.Millisecond}, Fix: "demo-fix",
		Name: "dropped_packets_total", Help: "Dropped.", Timeout: 100 * time.Millisecond}))
	exp := "# HELP nnm_demo_fix_dropped_packets_total Dropped.\n# TYPE nnm_demo_fix_dropped_packets_total counter\n" +
		`nnm_demo_fix_dropped_packets_total{family="ipv4"} 1` + "\n" +
		`nnm_demo_fix_dropped_packets_total{family="ipv6"} 1` + "\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp)); err != nil {
		t.Error(err)
	}
}
