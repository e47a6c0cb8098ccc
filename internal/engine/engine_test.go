package engine

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countFix drops traffic to each Service's first ClusterIP of the family: one rule per Service.
type countFix struct {
	id        string
	defaultOn bool
	refuse    error
	fail      error
	optErr    error
	observed  int
	computed  int // Rules calls
	// entries: the Services' Cluster-IPs go to a map, one entry each, named after the Service
	// (what a kernel refusal isolates), instead of one rule each.
	entries bool
}

func (f *countFix) ID() string                       { return f.id }
func (f *countFix) Description() string              { return "test fix" }
func (f *countFix) DefaultEnabled(fix.Env) bool      { return f.defaultOn }
func (f *countFix) Reads() []fix.TableRef            { return []fix.TableRef{inputs.Services} }
func (f *countFix) Configure(o map[string]any) error { return f.optErr }
func (f *countFix) Check(fix.Env) error              { return f.refuse }
func (f *countFix) Observe(context.Context, rules.Family, fix.Report) {
	f.observed++
}
func (f *countFix) Rules(snap *fix.Snapshot, fam rules.Family) (*rules.Ruleset, fix.Report, error) {
	f.computed++
	if f.fail != nil {
		return nil, fix.Report{}, f.fail
	}
	c := rules.Chain{Name: "T-" + strings.ToUpper(f.id), Type: rules.Filter, Hook: rules.Input}
	rep := fix.Report{}
	m := rules.Map{Name: "m"}
	for _, s := range inputs.Services.Get(snap) {
		for _, a := range s.ClusterIPs {
			if !fam.Contains(a) {
				continue
			}
			if f.entries {
				m.Entries = append(m.Entries, rules.MapEntry{Addr: a, Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(a, 80), Comment: s.Key()})
			} else {
				c.Rules = append(c.Rules, rules.Rule{Match: rules.Match{DstAddr: a}, Verdict: rules.Verdict{Kind: rules.Drop}})
			}
			rep.Covered++
		}
	}
	rs := &rules.Ruleset{Fix: f.id, Family: fam, Chains: []rules.Chain{c}}
	if f.entries {
		c.Rules = append(c.Rules, rules.Rule{Match: rules.Match{Lookup: m.Name}, Verdict: rules.Verdict{Kind: rules.Drop}})
		rs.Chains, rs.Maps = []rules.Chain{c}, []rules.Map{m}
	}
	return rs, rep, nil
}

// testOptions fills what o leaves unset with what most tests want: a fake backend, an empty
// in-memory source, the default configuration, fresh metrics and a silent log.
func testOptions(o Options) Options {
	if o.Backend == nil {
		o.Backend = testkit.NewFakeBackend()
	}
	if o.Hub == nil {
		src := newMemSource()
		o.Hub, o.Inputs = src.hub, src.ins()
	}
	if o.Config == nil {
		c := config.Defaults()
		o.Config = &c
	}
	if o.Metrics == nil {
		o.Metrics = metrics.NewSync(prometheus.NewRegistry())
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// mustNew is New over testOptions(o); an error fails the test.
func mustNew(t *testing.T, o Options) *Engine {
	t.Helper()
	e, err := New(testOptions(o))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

type harness struct {
	e   *Engine
	be  *testkit.FakeBackend
	src *memSource
	m   *metrics.Sync
	now time.Time
}

// setFixes reloads the default configuration with the given fixes section, as a ConfigMap edit
// would; the engine must accept it.
func (h *harness) setFixes(t *testing.T, fixes map[string]map[string]any) {
	t.Helper()
	c := config.Defaults()
	c.Fixes = fixes
	if !h.e.applyConfig(context.Background(), &c) {
		t.Fatalf("config with fixes %v rejected", fixes)
	}
}

func newHarness(t *testing.T, cfg *config.Config, fixes ...fix.Fix) *harness {
	t.Helper()
	h := &harness{be: testkit.NewFakeBackend(), src: newMemSource(), m: metrics.NewSync(prometheus.NewRegistry()), now: time.Unix(1000, 0)}
	h.e = mustNew(t, Options{Fixes: fixes, Backend: h.be, Hub: h.src.hub, Inputs: h.src.ins(), Config: cfg, Metrics: h.m, Now: func() time.Time { return h.now }})
	return h
}

func svc(name string, ips ...string) *fix.Service {
	return fix.ServiceFrom(testkit.Service("default", name, testkit.ClusterIPs(ips...), testkit.Ports(testkit.TCP(80))))
}

// TestRulesComputedOncePerState: a pass whose inputs did not change (the
// periodic Verify of an idle node, a change of a watch the fix does not read) reuses the fix's last rules instead of computing them over every
// Service again, and still verifies the kernel; a change of the source or of the configuration, and
// a failed computation, make the next pass compute.
func TestRulesComputedOncePerState(t *testing.T) {
	ctx := context.Background()
	f := &countFix{id: "count", defaultOn: true}
	src := newMemSource()
	be := testkit.NewFakeBackend()
	e := mustNew(t, Options{Fixes: []fix.Fix{f}, Backend: be, Hub: src.hub, Inputs: src.ins()})
	units := len(e.units)
	src.set(svc("a", "10.96.0.1", "fd00::1"))
	step := func(name string, full bool, wantComputed int) {
		t.Helper()
		f.computed = 0
		if e.SyncOnce(ctx, full) {
			t.Fatalf("%s: a pass failed", name)
		}
		if f.computed != wantComputed {
			t.Errorf("%s: Rules computed %d times, want %d", name, f.computed, wantComputed)
		}
	}
	step("first pass", true, units)
	step("a Verify with nothing changed", true, 0)
	step("a change pass with nothing changed", false, 0)
	src.pods.set(nil)
	step("a pass after a change of a watch the fix does not read", false, 0)
	be.Tamper("count", rules.IPv4)
	applies := be.ApplyCalls()
	step("a Verify after tampering, nothing changed in the API", true, 0)
	if be.ApplyCalls() != applies+1 {
		t.Errorf("the Verify did not repair the tampered rules from the reused ruleset (%d applies, want %d)", be.ApplyCalls(), applies+1)
	}
	src.set(svc("a", "10.96.0.1", "fd00::1"), svc("b", "10.96.0.2"))
	step("a pass after a Service was added", false, units)
	if rs := be.Ruleset("count", rules.IPv4); rs == nil || len(rs.Chains[0].Rules) != 2 {
		t.Errorf("the new Service's rule is not programmed: %v", rs)
	}
	step("the pass after that", true, 0)
	c := config.Defaults()
	if !e.applyConfig(ctx, &c) {
		t.Fatal("config rejected")
	}
	step("a pass after a reload", true, units)
	f.fail = errors.New("broken")
	src.set(svc("a", "10.96.0.1", "fd00::1"))
	f.computed = 0
	if failed := e.SyncOnce(ctx, false); !failed || f.computed != units {
		t.Fatalf("a failing computation: pass failed %v, Rules computed %d times; want failed, %d", failed, f.computed, units)
	}
	f.fail = nil
	step("a pass after a failed computation", false, units)
}

func TestSyncAppliesOnlyChangesAndRepairsDrift(t *testing.T) {
	f := &countFix{id: "count", defaultOn: true}
	h := newHarness(t, nil, f)
	h.src.set(svc("a", "10.96.0.1", "fd00::1"))
	ctx := context.Background()
	if h.e.SyncOnce(ctx, true) {
		t.Fatal("first sync failed")
	}
	if got := h.be.ApplyCalls(); got != 2 {
		t.Fatalf("want one apply per family, got %d", got)
	}
	if rs := h.be.Ruleset("count", rules.IPv6); rs == nil || len(rs.Chains[0].Rules) != 1 {
		t.Fatalf("IPv6 ruleset not applied: %v", rs)
	}
	// Nothing changed: neither a normal nor a full pass applies again.
	h.e.SyncOnce(ctx, false)
	h.e.SyncOnce(ctx, true)
	if got := h.be.ApplyCalls(); got != 2 {
		t.Fatalf("unchanged rules were applied again: %d applies", got)
	}
	// A change is applied in the next pass, only for the family it touches.
	h.src.set(svc("a", "10.96.0.1", "fd00::1"), svc("b", "10.96.0.2"))
	h.e.SyncOnce(ctx, false)
	if got := h.be.ApplyCalls(); got != 3 {
		t.Fatalf("want 3 applies after an IPv4-only change, got %d", got)
	}
	// Someone deletes our rules: a normal pass does not notice, a full pass repairs.
	h.be.Tamper("count", rules.IPv4)
	h.e.SyncOnce(ctx, false)
	if got := h.be.ApplyCalls(); got != 3 {
		t.Fatalf("a normal pass must not check the kernel: %d", got)
	}
	h.e.SyncOnce(ctx, true)
	if got := h.be.ApplyCalls(); got != 4 {
		t.Fatalf("full pass did not repair: %d applies", got)
	}
	if v := testutil.ToFloat64(h.m.Repairs.WithLabelValues("count", "fake", "ipv4")); v != 1 {
		t.Fatalf("repairs metric = %v", v)
	}
	if v := testutil.ToFloat64(h.m.Rules.WithLabelValues("count", "fake", "ipv4")); v != 2 {
		t.Fatalf("rules_programmed = %v", v)
	}
	if f.observed == 0 {
		t.Fatal("Observer was not called")
	}
}

func TestFailedApplyKeepsPreviousRulesAndCounts(t *testing.T) {
	f := &countFix{id: "count", defaultOn: true}
	h := newHarness(t, nil, f)
	h.src.set(svc("a", "10.96.0.1"))
	ctx := context.Background()
	h.e.SyncOnce(ctx, false)
	before := h.be.Dump()
	h.be.SetApplyError(errors.New("kernel says no"))
	h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	if !h.e.SyncOnce(ctx, false) {
		t.Fatal("sync must report failure")
	}
	if h.be.Dump() != before {
		t.Fatal("failed apply changed the rules")
	}
	if v := testutil.ToFloat64(h.m.Errors.WithLabelValues("count", "fake")); v != 1 {
		t.Fatalf("sync_errors_total = %v", v)
	}
	h.be.SetApplyError(nil)
	if h.e.SyncOnce(ctx, true) {
		t.Fatal("retry failed")
	}
	if rs := h.be.Ruleset("count", rules.IPv4); len(rs.Chains[0].Rules) != 2 {
		t.Fatal("retry did not apply the change")
	}
}

func TestHealthAndReadiness(t *testing.T) {
	f := &countFix{id: "count", defaultOn: true}
	h := newHarness(t, nil, f)
	h.e.started = h.now
	if h.e.Ready() == nil {
		t.Fatal("ready before any sync")
	}
	h.e.SyncOnce(context.Background(), true)
	if err := h.e.Ready(); err != nil {
		t.Fatal(err)
	}
	h.now = h.now.Add(59 * time.Second)
	if err := h.e.Healthy(); err != nil {
		t.Fatalf("healthy within 2 x syncPeriod: %v", err)
	}
	f.fail = errors.New("broken")
	h.src.set(svc("a", "10.96.0.1")) // a change: the rules are computed again, and fail
	h.e.SyncOnce(context.Background(), true)
	h.now = h.now.Add(2 * time.Second)
	err := h.e.Healthy()
	if err == nil || !strings.Contains(err.Error(), "broken") || !strings.Contains(err.Error(), "count") {
		t.Fatalf("unhealthy after 2 x syncPeriod without success, naming the fix and error; got %v", err)
	}
}

func TestDisabledFixesAreRemovedAndReconfigured(t *testing.T) {
	on := &countFix{id: "on", defaultOn: true}
	off := &countFix{id: "off", defaultOn: false}
	h := newHarness(t, nil, on, off)
	h.src.set(svc("a", "10.96.0.1"))
	ctx := context.Background()
	// Pretend "off" had rules from an earlier run.
	if err := testkit.Apply(ctx, h.be, &rules.Ruleset{Fix: "off", Family: rules.IPv4, Chains: []rules.Chain{{Name: "T-OFF", Type: rules.Filter, Hook: rules.Input}}}); err != nil {
		t.Fatal(err)
	}
	h.e.SyncOnce(ctx, true)
	h.e.SyncOnce(ctx, true)
	if h.be.Ruleset("off", rules.IPv4) != nil {
		t.Fatal("disabled fix's rules survived start-up")
	}
	if h.be.Ruleset("on", rules.IPv4) == nil {
		t.Fatal("enabled fix not applied")
	}
	// A config that disables "on" removes it and keeps nothing else.
	h.setFixes(t, map[string]map[string]any{"on": {"enabled": false}})
	h.e.SyncOnce(ctx, true) // what the workers do on a reload: a full pass
	if h.be.Ruleset("on", rules.IPv4) != nil {
		t.Fatal("rules of a fix disabled by reload survived")
	}
	// A config that a fix rejects changes nothing.
	on.optErr = errors.New("bad option")
	c2 := config.Defaults()
	if h.e.applyConfig(ctx, &c2) {
		t.Fatal("config with a rejected option was taken")
	}
	if st := h.e.Statuses(); st[0].Enabled || st[1].Enabled {
		t.Fatalf("rejected config changed the enabled set: %+v", st)
	}
}

func TestRefusedFix(t *testing.T) {
	f := &countFix{id: "picky", defaultOn: true, refuse: errors.New("not in iptables mode")}
	c := config.Defaults()
	c.Fixes = map[string]map[string]any{"picky": {"enabled": true}}
	h := newHarness(t, &c, f)
	if errs := h.e.Refusals(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "not in iptables mode") {
		t.Fatalf("want the refusal reported, got %v", errs)
	}
	h.e.SyncOnce(context.Background(), true)
	if h.be.ApplyCalls() != 0 {
		t.Fatal("a refused fix was applied")
	}
}

func TestLoopCoalescesAndStops(t *testing.T) {
	f := &countFix{id: "count", defaultOn: true}
	c := config.Defaults()
	c.MinSyncPeriod = 50 * time.Millisecond
	c.Families = []string{"ipv4"}
	h := newHarness(t, &c, f)
	h.e.now = time.Now
	h.src.set(svc("a", "10.96.0.1"))
	if err := h.e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, wait, func() bool { return h.be.ApplyCalls() == 1 })
	for i := 0; i < 20; i++ { // a burst of changes
		h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0."+string(rune('2'+i%8))))
	}
	agenttest.Until(t, wait, func() bool {
		rs := h.be.Ruleset("count", rules.IPv4)
		return rs != nil && len(rs.Chains[0].Rules) == 2
	})
	if n := h.be.ApplyCalls(); n > 4 {
		t.Fatalf("a burst of 20 changes caused %d applies; want them coalesced", n)
	}
	if err := h.e.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !h.src.stopped() {
		t.Fatal("source not stopped")
	}
	if h.be.Ruleset("count", rules.IPv4) == nil {
		t.Fatal("rules must stay in the kernel when the agent stops")
	}
}

// wait bounds every wait for the engine's workers (agenttest.Until).
const wait = 20 * time.Second

// nodeFix is a fix.Actuator: it keeps a pretend node setting at "on" and counts what the engine asks.
type nodeFix struct {
	id        string
	defaultOn bool
	fail      error

	reads    []fix.TableRef
	value    string // the pretend node state
	ensures  []bool // the full flag of every Ensure
	snaps    []*fix.Snapshot
	reverts  int
	observed []rules.Family
}

func (f *nodeFix) ID() string                       { return f.id }
func (f *nodeFix) Description() string              { return "test actuator" }
func (f *nodeFix) DefaultEnabled(fix.Env) bool      { return f.defaultOn }
func (f *nodeFix) Reads() []fix.TableRef            { return f.reads }
func (f *nodeFix) Configure(o map[string]any) error { return nil }
func (f *nodeFix) Ensure(_ context.Context, snap *fix.Snapshot, full bool) (fix.Result, error) {
	f.ensures = append(f.ensures, full)
	f.snaps = append(f.snaps, snap)
	if f.fail != nil {
		return fix.Result{}, f.fail
	}
	res := fix.Result{Report: fix.Report{Covered: 1}}
	if f.value != "on" {
		res.Changed = true
		res.Repaired = f.value == "reset" // someone reset what an earlier Ensure set
		f.value = "on"
	}
	return res, nil
}
func (f *nodeFix) Revert(context.Context) error {
	f.reverts++
	f.value = "off"
	return nil
}
func (f *nodeFix) Observe(_ context.Context, fam rules.Family, _ fix.Report) {
	f.observed = append(f.observed, fam)
}

func TestActuatorEnsuredOncePerPassWithMetrics(t *testing.T) {
	a := &nodeFix{id: "node-setting", defaultOn: true, value: "off"}
	r := &countFix{id: "count", defaultOn: true}
	h := newHarness(t, nil, a, r)
	h.src.set(svc("a", "10.96.0.1", "fd00::1"))
	ctx := context.Background()
	if h.e.SyncOnce(ctx, true) {
		t.Fatal("first sync failed")
	}
	if len(a.ensures) != 1 || !a.ensures[0] || a.value != "on" {
		t.Fatalf("want one full Ensure per pass (not per family), got %v, value %q", a.ensures, a.value)
	}
	if h.be.ApplyCalls() != 2 || h.be.Ruleset("node-setting", rules.IPv4) != nil {
		t.Fatalf("the rule backend must only see the rule fix: %d applies\n%s", h.be.ApplyCalls(), h.be.Dump())
	}
	if len(a.observed) != 1 || a.observed[0] != "" {
		t.Fatalf("Observe after Ensure with no family: %v", a.observed)
	}
	h.e.SyncOnce(ctx, false)
	if len(a.ensures) != 2 || a.ensures[1] {
		t.Fatalf("a change-driven pass must say full=false: %v", a.ensures)
	}
	// Someone resets the setting: the next full pass repairs it and counts the repair.
	a.value = "reset"
	h.e.SyncOnce(ctx, true)
	if a.value != "on" {
		t.Fatal("full pass did not repair")
	}
	for name, got := range map[string]float64{
		"syncs":    testutil.ToFloat64(h.m.Syncs.WithLabelValues("node-setting", fix.NodeBackend)),
		"repairs":  testutil.ToFloat64(h.m.Repairs.WithLabelValues("node-setting", fix.NodeBackend, "")),
		"covered":  testutil.ToFloat64(h.m.Covered.WithLabelValues("node-setting", "")),
		"last-ok":  testutil.ToFloat64(h.m.LastSuccess.WithLabelValues("node-setting", fix.NodeBackend)),
		"errors":   testutil.ToFloat64(h.m.Errors.WithLabelValues("node-setting", fix.NodeBackend)),
		"rule-fix": testutil.ToFloat64(h.m.Syncs.WithLabelValues("count", "fake")),
	} {
		want := map[string]float64{"syncs": 3, "repairs": 1, "covered": 1, "last-ok": 1000, "errors": 0, "rule-fix": 6}[name]
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// Plan lists the rule fix's rules only; Statuses says which fix changes node state.
	sets, _, err := h.e.Plan()
	if err != nil || len(sets) != 2 || sets[0].Fix != "count" {
		t.Fatalf("Plan = %v, %v", sets, err)
	}
	for _, st := range h.e.Statuses() {
		if st.NodeState != (st.Fix == "node-setting") {
			t.Errorf("status of %s: NodeState %v", st.Fix, st.NodeState)
		}
		// One unit per family for the rule fix, one without a family for the node-state fix; each
		// synced, with no error.
		var fams []rules.Family
		for _, u := range st.Units {
			fams = append(fams, u.Family)
			if !u.Synced || u.LastErr != nil || u.LastOK.IsZero() {
				t.Errorf("status of %s (%s): %+v", st.Fix, u.Family, u)
			}
		}
		if want := map[bool][]rules.Family{true: {""}, false: rules.Families}[st.NodeState]; !slices.Equal(fams, want) {
			t.Errorf("status of %s: units of families %v, want %v", st.Fix, fams, want)
		}
	}
}

// bothFix implements fix.RuleFix and fix.Actuator at once.
type bothFix struct{ countFix }

func (f *bothFix) Ensure(context.Context, *fix.Snapshot, bool) (fix.Result, error) {
	return fix.Result{}, nil
}
func (f *bothFix) Revert(context.Context) error { return nil }

// neitherFix implements only the common fix.Fix.
type neitherFix struct{ id string }

func (f *neitherFix) ID() string                       { return f.id }
func (f *neitherFix) Description() string              { return "no repair" }
func (f *neitherFix) DefaultEnabled(fix.Env) bool      { return true }
func (f *neitherFix) Reads() []fix.TableRef            { return nil }
func (f *neitherFix) Configure(o map[string]any) error { return nil }

// TestRegistryRefusesAFixThatIsNeitherOrBoth: a fix is a RuleFix or an Actuator; the engine refuses
// one that is neither or both, naming it (id and Go type) and what it implements.
func TestRegistryRefusesAFixThatIsNeitherOrBoth(t *testing.T) {
	c := config.Defaults()
	for _, tc := range []struct {
		f    fix.Fix
		want []string
	}{
		{&bothFix{countFix{id: "two-faced"}}, []string{"fix two-faced", "*engine.bothFix", "both fix.RuleFix", "fix.Actuator"}},
		{&neitherFix{id: "idle"}, []string{"fix idle", "*engine.neitherFix", "neither fix.RuleFix", "nor fix.Actuator"}},
	} {
		_, err := New(testOptions(Options{Fixes: []fix.Fix{&countFix{id: "count"}, tc.f}, Config: &c}))
		if err == nil {
			t.Errorf("%s: registered", tc.f.ID())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.f.ID(), err, w)
			}
		}
	}
	// One of each registers, with a unit per family for the RuleFix and one for the Actuator.
	h := newHarness(t, nil, &countFix{id: "count"}, &nodeFix{id: "node-setting"})
	if len(h.e.units) != len(rules.Families)+1 {
		t.Errorf("units = %v", h.e.units)
	}
}

func TestActuatorFailureIsRetriedAndUnhealthy(t *testing.T) {
	a := &nodeFix{id: "node-setting", defaultOn: true, fail: errors.New("read-only /proc/sys")}
	h := newHarness(t, nil, a)
	h.e.started = h.now
	ctx := context.Background()
	if !h.e.SyncOnce(ctx, true) {
		t.Fatal("a failed Ensure must fail the pass (so that it is retried)")
	}
	if v := testutil.ToFloat64(h.m.Errors.WithLabelValues("node-setting", fix.NodeBackend)); v != 1 {
		t.Fatalf("sync_errors_total = %v", v)
	}
	if len(a.observed) != 0 {
		t.Fatal("Observe after a failed Ensure")
	}
	h.now = h.now.Add(61 * time.Second)
	if err := h.e.Healthy(); err == nil || !strings.Contains(err.Error(), "read-only /proc/sys") {
		t.Fatalf("Healthy = %v, want the Ensure error", err)
	}
	a.fail = nil
	if h.e.SyncOnce(ctx, true) || h.e.Healthy() != nil {
		t.Fatal("recovery not seen")
	}
}

func TestActuatorRevertedWhenDisabled(t *testing.T) {
	a := &nodeFix{id: "node-setting", defaultOn: false, value: "on"} // "on" from an earlier run
	h := newHarness(t, nil, a)
	ctx := context.Background()
	h.e.SyncOnce(ctx, true)
	if a.reverts != 1 || a.value != "off" {
		t.Fatalf("disabled at start: want one Revert, got %d (value %q)", a.reverts, a.value)
	}
	h.e.SyncOnce(ctx, true)
	if len(a.ensures) != 0 {
		t.Fatal("a disabled Actuator was ensured")
	}
	// Enabled by a reload: ensured, not reverted.
	h.setFixes(t, map[string]map[string]any{"node-setting": {"enabled": true}})
	h.e.SyncOnce(ctx, true)
	if a.reverts != 1 || a.value != "on" {
		t.Fatalf("enabled by reload: reverts=%d value=%q", a.reverts, a.value)
	}
	// Disabled by a reload: reverted once, whatever the number of families.
	h.setFixes(t, map[string]map[string]any{"node-setting": {"enabled": false}})
	h.e.SyncOnce(ctx, true)
	if a.reverts != 2 || a.value != "off" {
		t.Fatalf("disabled by reload: reverts=%d value=%q", a.reverts, a.value)
	}
	if h.be.ApplyCalls() != 0 {
		t.Fatal("the rule backend was used for an Actuator")
	}
}

func newIPv4Harness(t *testing.T, fixes ...fix.Fix) *harness {
	t.Helper()
	c := config.Defaults()
	c.Families = []string{"ipv4"}
	return newHarness(t, &c, fixes...)
}

// Drift is repaired by a full pass even when the same pass also applies a change.
func TestFullPassRepairsDriftWhileRulesChange(t *testing.T) {
	h := newIPv4Harness(t, &countFix{id: "count", defaultOn: true})
	ctx := context.Background()
	h.src.set(svc("a", "10.96.0.1"))
	h.e.SyncOnce(ctx, true)
	h.be.Tamper("count", rules.IPv4) // someone flushed our chain
	h.src.set(svc("a", "10.96.0.1"), svc("b", "10.96.0.2"))
	if h.e.SyncOnce(ctx, true) {
		t.Fatal("full pass failed")
	}
	if v := testutil.ToFloat64(h.m.Repairs.WithLabelValues("count", "fake", "ipv4")); v != 1 {
		t.Fatalf("repairs metric = %v, want 1 (drift found by the full pass that also applied a change)", v)
	}
	// A normal (change-triggered) pass does not pay for the check.
	reads := h.be.ReadBacks()
	h.be.Tamper("count", rules.IPv4)
	h.src.set(svc("a", "10.96.0.1"))
	h.e.SyncOnce(ctx, false)
	if h.be.ReadBacks() != reads {
		t.Fatal("a normal pass checked the kernel")
	}
}

// optFix records the options it holds and rejects options with "bad" set.
type optFix struct {
	countFix
	opts map[string]any
}

func (f *optFix) Configure(o map[string]any) error {
	if o["bad"] != nil {
		return errors.New("bad option")
	}
	f.opts = o
	return nil
}

// A configuration that one fix rejects leaves every fix with its running options.
func TestRejectedConfigRestoresEarlierFixes(t *testing.T) {
	a := &optFix{countFix: countFix{id: "a-first", defaultOn: true}}
	b := &optFix{countFix: countFix{id: "b-second", defaultOn: true}}
	c := config.Defaults()
	c.Fixes = map[string]map[string]any{"a-first": {"mode": "old"}, "b-second": {}}
	h := newHarness(t, &c, a, b)
	next := config.Defaults()
	next.Fixes = map[string]map[string]any{"a-first": {"mode": "new"}, "b-second": {"bad": true}}
	if h.e.applyConfig(context.Background(), &next) {
		t.Fatal("a configuration with a rejected option was taken")
	}
	if a.opts["mode"] != "old" {
		t.Fatalf("fix a-first kept the rejected configuration's options: %v", a.opts)
	}
}

// A disabled fix whose removal failed is removed by a later full pass, and the failure counts.
func TestFailedRemovalIsRetried(t *testing.T) {
	off := &countFix{id: "off", defaultOn: false}
	h := newIPv4Harness(t, off)
	ctx := context.Background()
	rs := &rules.Ruleset{Fix: "off", Family: rules.IPv4, Chains: []rules.Chain{{Name: "T-OFF", Type: rules.Filter, Hook: rules.Input}}}
	if err := testkit.Apply(ctx, h.be, rs); err != nil {
		t.Fatal(err)
	}
	var removeErr atomic.Pointer[error]
	held := errors.New("xtables lock held")
	removeErr.Store(&held)
	h.be.OnReconcile(func(_ context.Context, fix string, _ rules.Family, _ backend.Mode) error {
		if p := removeErr.Load(); fix == "off" && p != nil {
			return *p
		}
		return nil
	})
	if !h.e.SyncOnce(ctx, true) {
		t.Fatal("a full pass must fail while the removal keeps failing")
	}
	removeErr.Store(nil)
	h.e.SyncOnce(ctx, false)
	if h.be.Ruleset("off", rules.IPv4) == nil {
		t.Fatal("a normal pass must not retry the removal")
	}
	if h.e.SyncOnce(ctx, true) {
		t.Fatal("full pass failed after the removal could succeed")
	}
	if h.be.Ruleset("off", rules.IPv4) != nil {
		t.Fatal("the disabled fix's rules are still there")
	}
}

// A fix enabled long after start gets 2 x syncPeriod from the moment it was enabled.
func TestHealthCountsFromEnabling(t *testing.T) {
	f := &countFix{id: "late", defaultOn: false}
	h := newHarness(t, nil, f)
	h.e.started = h.now
	h.now = h.now.Add(10 * time.Minute)
	h.setFixes(t, map[string]map[string]any{"late": {"enabled": true}})
	f.fail = errors.New("not yet")
	h.e.SyncOnce(context.Background(), true)
	if err := h.e.Healthy(); err != nil {
		t.Fatalf("a fix enabled just now must not be unhealthy yet: %v", err)
	}
	h.now = h.now.Add(61 * time.Second)
	if err := h.e.Healthy(); err == nil {
		t.Fatal("still healthy after 2 x syncPeriod without success")
	}
}

// A fix that reads this node's Pods gets the Pods input started and the Pods in its snapshot; a
// snapshot for fixes that do not read them carries none, and their input is not started.
func TestPodsOnlyWhenRead(t *testing.T) {
	reader := &nodeFix{id: "pod-reader", defaultOn: true, reads: []fix.TableRef{inputs.Pods}}
	h := newHarness(t, nil, reader)
	h.src.pods.set([]*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}})
	if got := strings.Join(h.e.Reads(), ","); got != "Pods" {
		t.Fatalf("Reads = %s, want Pods", got)
	}
	h.e.SyncOnce(context.Background(), true)
	if h.src.pods.startCount() != 1 || h.src.services.startCount() != 0 {
		t.Errorf("inputs started: Pods %d, Services %d; want the Pods once, not the Services", h.src.pods.startCount(), h.src.services.startCount())
	}
	if snap := h.e.Snapshot(); len(inputs.Pods.Get(snap)) != 1 {
		t.Fatalf("snapshot Pods = %v", inputs.Pods.Get(snap))
	}
	if len(reader.snaps) == 0 || len(inputs.Pods.Get(reader.snaps[len(reader.snaps)-1])) != 1 {
		t.Fatalf("the fix's Ensure did not see the Pods")
	}
	other := newHarness(t, nil, &nodeFix{id: "other", defaultOn: true})
	other.src.pods.set(inputs.Pods.Get(h.e.Snapshot()))
	if r, snap := other.e.Reads(), other.e.Snapshot(); len(r) != 0 || inputs.Pods.Get(snap) != nil {
		t.Fatalf("Reads = %v, Pods %v; want none", r, inputs.Pods.Get(snap))
	}
}

// A fix that reads a table no input module provides is refused at New, naming the fix and the table.
func TestFixReadingAnUnprovidedTableIsRefused(t *testing.T) {
	f := &nodeFix{id: "reader", defaultOn: true, reads: []fix.TableRef{fix.NewTable[[]string]("EndpointSlices")}}
	_, err := New(testOptions(Options{Fixes: []fix.Fix{f}}))
	if err == nil || !strings.Contains(err.Error(), "fix reader reads the table EndpointSlices, which no input module provides") {
		t.Fatalf("New = %v; want the unprovided table named", err)
	}
}
