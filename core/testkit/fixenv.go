package testkit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// FixEnv is where a fix's unit tests run: the fix, built by its constructor on the core's seams
// faked (a FakeBackend, a nodestate.FakeSysctl, a nodestate.FakeConntrack), a fresh Prometheus registry, and the
// fix's logs. Its helpers fail the test on error.
//
//	e := testkit.NewFixEnv(t, mssclamp.New, map[string]any{"mss": 1360})
//	testkit.Golden(t, "testdata/fixed-mss.golden", e.Dump(snap)) // rules and report, both families
//	e.SetCounter(rules.IPv4, "syn-from-pods", 3)
//	got := e.Metric("nnm_mss_clamp_syn_packets_total")         // `{family="ipv4"} 3`
type FixEnv[F fix.Fix] struct {
	Fix       F
	Backend   *FakeBackend
	Sysctl    *nodestate.FakeSysctl
	Conntrack *nodestate.FakeConntrack
	// Registry is the one the fix registered its metrics on; Restart replaces it.
	Registry *prometheus.Registry
	// Logs holds what the fix logged (text format, debug level and up).
	Logs *LogBuffer

	tb     testing.TB
	newFix func(fix.Params) (F, error)
}

// NewFixEnv builds the fix with newFix (the fix's New) on fresh fakes and configures it with
// options (nil: its defaults, without a Configure call). Set up the fakes (Sysctl.Values,
// Conntrack.Add) before the fix's first sync: constructors do no I/O.
func NewFixEnv[F fix.Fix](tb testing.TB, newFix func(fix.Params) (F, error), options map[string]any) *FixEnv[F] {
	tb.Helper()
	e := &FixEnv[F]{Backend: NewFakeBackend(), Sysctl: nodestate.NewFakeSysctl(nil), Conntrack: nodestate.NewFakeConntrack(),
		Logs: &LogBuffer{}, tb: tb, newFix: newFix}
	return e.Restart(options)
}

// Params is what the fix's constructor gets: e's fakes, registry and a logger writing to Logs.
func (e *FixEnv[F]) Params() fix.Params {
	return fix.Params{Backend: e.Backend, Sysctl: e.Sysctl, Conntrack: e.Conntrack, Registry: e.Registry,
		Logger: slog.New(slog.NewTextHandler(e.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

// Restart builds a new fix on the same fakes and logs with a new registry, as an agent restart
// does, and configures it with options (nil: the defaults). It returns e.
func (e *FixEnv[F]) Restart(options map[string]any) *FixEnv[F] {
	e.tb.Helper()
	e.Registry = prometheus.NewRegistry()
	f, err := e.newFix(e.Params())
	if err != nil {
		e.tb.Fatalf("build the fix: %v", err)
	}
	e.Fix = f
	if options != nil {
		e.Configure(options)
	}
	return e
}

// Configure configures the fix with options and fails the test when it refuses them.
func (e *FixEnv[F]) Configure(options map[string]any) {
	e.tb.Helper()
	if err := e.Fix.Configure(options); err != nil {
		e.tb.Fatalf("Configure(%v): %v", options, err)
	}
}

// ConfigureFails configures the fix with options, which it must refuse with an error that contains
// every one of want; the rules of snap (for a RuleFix; nil: an empty snapshot) must be the same
// after as before. It reports a failure with Errorf and returns the error.
func (e *FixEnv[F]) ConfigureFails(snap *fix.Snapshot, options map[string]any, want ...string) error {
	e.tb.Helper()
	var before string
	if e.isRuleFix() {
		before = e.Dump(snap)
	}
	err := e.Fix.Configure(options)
	if err == nil {
		e.tb.Errorf("Configure(%v) accepted, want an error", options)
		return nil
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			e.tb.Errorf("Configure(%v) = %q, want it to mention %s", options, err, w)
		}
	}
	if e.isRuleFix() && e.Dump(snap) != before {
		e.tb.Errorf("a rejected Configure(%v) changed the rules", options)
	}
	return err
}

func (e *FixEnv[F]) isRuleFix() bool {
	_, ok := any(e.Fix).(fix.RuleFix)
	return ok
}

func (e *FixEnv[F]) ruleFix() fix.RuleFix {
	e.tb.Helper()
	rf, _, err := fix.As(e.Fix)
	if err != nil || rf == nil {
		e.tb.Fatalf("%s is not a fix.RuleFix (%v)", e.Fix.ID(), err)
	}
	return rf
}

// Sync does what the engine does for a RuleFix in one family: it asks for the rules of snap (nil: an
// empty snapshot), makes the fake backend hold them (nothing, for a nil ruleset), checking the
// kernel first, and hands the report to the fix's Observe, if it has one, with the objects the
// backend refused (FakeBackend.RejectObject) as skips.
func (e *FixEnv[F]) Sync(snap *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report) {
	e.tb.Helper()
	if snap == nil {
		snap = Snapshot()
	}
	rf := e.ruleFix()
	rs, report, err := rf.Rules(snap, family)
	if err != nil {
		e.tb.Fatalf("%s: Rules(%s): %v", rf.ID(), family, err)
	}
	ctx := context.Background()
	var res backend.Result
	if rs == nil {
		res, err = e.Backend.Reconcile(ctx, rf.ID(), family, nil, backend.Verify)
	} else {
		res, err = Verify(ctx, e.Backend, rs)
	}
	if err != nil {
		e.tb.Fatalf("the fake backend rejected the %s rules: %v\n%s", family, err, Format(rs))
	}
	report = report.WithRejected(res.Rejected)
	if o, ok := any(e.Fix).(fix.Observer); ok {
		o.Observe(ctx, family, report)
	}
	return rs, report
}

// Dump syncs both families (Sync) and returns what golden files hold: per family FormatResult,
// families separated by an empty line.
func (e *FixEnv[F]) Dump(snap *fix.Snapshot) string {
	e.tb.Helper()
	var out []string
	for _, fam := range rules.Families {
		out = append(out, FormatResult(e.Sync(snap, fam)))
	}
	return strings.Join(out, "\n")
}

// FormatResult is the outcome of one Rules call: Format(rs), a line "report covered=N items=M", and
// one line per skip ("  skip <object> <reason>: <detail>").
func FormatResult(rs *rules.Ruleset, report fix.Report) string {
	var b strings.Builder
	b.WriteString(Format(rs))
	fmt.Fprintf(&b, "report covered=%d items=%d\n", report.Covered, report.Items)
	for _, s := range report.Skipped {
		fmt.Fprintf(&b, "  skip %s %s: %s\n", s.Object, s.Reason, s.Detail)
	}
	return b.String()
}

// Ensure runs one pass of an Actuator on snap (nil: an empty snapshot) and fails the test on error.
func (e *FixEnv[F]) Ensure(snap *fix.Snapshot, full bool) fix.Result {
	e.tb.Helper()
	_, a, err := fix.As(e.Fix)
	if err != nil || a == nil {
		e.tb.Fatalf("%s is not a fix.Actuator (%v)", e.Fix.ID(), err)
	}
	if snap == nil {
		snap = Snapshot()
	}
	res, err := a.Ensure(context.Background(), snap, full)
	if err != nil {
		e.tb.Fatalf("Ensure(full=%v): %v", full, err)
	}
	return res
}

// SetCounter sets the packets (and 60 bytes a packet) of the fix's rule counter name in family, in
// the fake backend; the fix's rules must be applied there (Sync).
func (e *FixEnv[F]) SetCounter(family rules.Family, name string, packets uint64) {
	e.tb.Helper()
	if err := e.Backend.SetCounter(e.Fix.ID(), family, name, backend.Counter{Packets: packets, Bytes: 60 * packets}); err != nil {
		e.tb.Fatal(err)
	}
}

// Metric returns the series of the metric name on e.Registry (Series).
func (e *FixEnv[F]) Metric(name string) string {
	e.tb.Helper()
	return Series(e.tb, e.Registry, name)
}

// Series gathers g and returns the series of the metric name, one line each in the order Prometheus
// sorts them: `{label="value",…} <value>` (`<value>` alone without labels); "" when it has none.
func Series(tb testing.TB, g prometheus.Gatherer, name string) string {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var lines []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			line := fmt.Sprint(value(m))
			if len(labels) > 0 {
				line = "{" + strings.Join(labels, ",") + "} " + line
			}
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// Value returns the value of the series of the metric name whose labels include labelPairs (name,
// value, name, value…), and whether there is one.
func Value(tb testing.TB, g prometheus.Gatherer, name string, labelPairs ...string) (float64, bool) {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labelPairs); i += 2 {
				if have[labelPairs[i]] != labelPairs[i+1] {
					continue series
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}
