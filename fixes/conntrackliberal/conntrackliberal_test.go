package conntrackliberal

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/config"
	"github.com/network-node-manager/network-node-manager/core/engine"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/sysctl"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/watch"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
)

// The fix reads nothing from the cluster: the unit tests run it against sysctl.Fake and a state
// directory under t.TempDir(); kernel_test.go runs it against the real /proc/sys of a throwaway
// network namespace.

var ctx = context.Background()

type env struct {
	fix  *Fix
	sys  *sysctl.Fake
	reg  *prometheus.Registry
	dir  string
	logs *bytes.Buffer
}

// newEnv builds the fix with the sysctl at value ("" for a kernel without nf_conntrack) and
// stateDir set to a fresh directory unless options say otherwise.
func newEnv(t *testing.T, value string, options map[string]any) *env {
	t.Helper()
	e := &env{sys: sysctl.NewFake(nil), reg: prometheus.NewRegistry(), dir: t.TempDir(), logs: &bytes.Buffer{}}
	if value != "" {
		e.sys.Values[sysctl.ConntrackTCPBeLiberal] = value
	}
	return e.restart(t, options)
}

// restart builds a new Fix on the same sysctl and state directory, as an agent restart does.
func (e *env) restart(t *testing.T, options map[string]any) *env {
	t.Helper()
	e.reg = prometheus.NewRegistry()
	f, err := New(Params{Sysctl: e.sys, Registry: e.reg, Logger: slog.New(slog.NewTextHandler(e.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	opts := map[string]any{"stateDir": e.dir}
	for k, v := range options {
		opts[k] = v
	}
	if err := f.Configure(opts); err != nil {
		t.Fatal(err)
	}
	e.fix = f
	return e
}

func (e *env) value() string { return e.sys.Values[sysctl.ConntrackTCPBeLiberal] }

func (e *env) ensure(t *testing.T, full bool) fix.Result {
	t.Helper()
	res, err := e.fix.Ensure(ctx, testkit.Snapshot(), full)
	if err != nil {
		t.Fatalf("Ensure(full=%v): %v", full, err)
	}
	return res
}

func (e *env) stateFile() (record, bool) {
	b, err := os.ReadFile(filepath.Join(e.dir, StateFile))
	if err != nil {
		return record{}, false
	}
	var r record
	_ = json.Unmarshal(b, &r)
	return r, true
}

func TestEnsureRepairRevert(t *testing.T) {
	e := newEnv(t, "0", nil)
	if res := e.ensure(t, true); !res.Changed || res.Repaired || e.value() != "1" {
		t.Fatalf("first Ensure: %+v, value %q", res, e.value())
	}
	if r, ok := e.stateFile(); !ok || r.Previous != "0" || r.Sysctl != sysctl.ConntrackTCPBeLiberal {
		t.Fatalf("state file: %+v %v", r, ok)
	}
	// Nothing to do: no write, neither in a normal nor in a full pass.
	e.ensure(t, false)
	if res := e.ensure(t, true); res.Changed || res.Repaired || e.sys.Writes != 1 {
		t.Fatalf("idempotent Ensure: %+v, %d writes", res, e.sys.Writes)
	}
	// Someone resets it: a normal pass trusts its last Ensure, a full pass repairs.
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "0"
	if res := e.ensure(t, false); res.Repaired || e.value() != "0" {
		t.Fatalf("a normal pass must not re-read the sysctl: %+v", res)
	}
	if res := e.ensure(t, true); !res.Repaired || e.value() != "1" {
		t.Fatalf("full pass: %+v, value %q", res, e.value())
	}
	if r, _ := e.stateFile(); r.Previous != "0" {
		t.Fatalf("a repair must not overwrite the remembered value: %+v", r)
	}
	// Disabled: the old value comes back and the record goes.
	if err := e.fix.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.stateFile(); ok || e.value() != "0" {
		t.Fatalf("after Revert: value %q, state file kept: %v", e.value(), ok)
	}
	writes := e.sys.Writes
	if err := e.fix.Revert(ctx); err != nil || e.sys.Writes != writes {
		t.Fatalf("a second Revert must be a no-op: %v, %d writes", err, e.sys.Writes-writes)
	}
	// Enabled again: remembers afresh.
	if res := e.ensure(t, false); !res.Changed || e.value() != "1" {
		t.Fatalf("re-enabled: %+v", res)
	}
}

func TestRestartWhileEnabled(t *testing.T) {
	e := newEnv(t, "0", nil)
	e.ensure(t, true)
	// The agent restarts: the new process finds 1 (its own) and the record.
	e.restart(t, nil)
	if res := e.ensure(t, true); res.Changed || res.Repaired {
		t.Fatalf("after restart: %+v", res)
	}
	if r, _ := e.stateFile(); r.Previous != "0" {
		t.Fatalf("restart forgot the previous value: %+v", r)
	}
	// Reset while the agent was down: a repair, and the previous value is still the original one.
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "0"
	e.restart(t, nil)
	if res := e.ensure(t, true); !res.Repaired || e.value() != "1" {
		t.Fatalf("reset during restart: %+v", res)
	}
	// Restarted with the fix disabled: the engine reverts at start-up.
	e.restart(t, nil)
	if err := e.fix.Revert(ctx); err != nil || e.value() != "0" {
		t.Fatalf("revert after restart: %v, value %q", err, e.value())
	}
}

func TestAlreadyLiberalIsLeftAlone(t *testing.T) {
	// kube-proxy --conntrack-tcp-be-liberal got there first: nothing to write, nothing to undo.
	e := newEnv(t, "1", nil)
	if res := e.ensure(t, true); res.Changed || e.sys.Writes != 0 {
		t.Fatalf("%+v, %d writes", res, e.sys.Writes)
	}
	if err := e.fix.Revert(ctx); err != nil || e.value() != "1" || e.sys.Writes != 0 {
		t.Fatalf("Revert changed a value that was never ours: %v %q", err, e.value())
	}
}

func TestRevertLeavesSomeoneElsesValue(t *testing.T) {
	e := newEnv(t, "1", nil)
	e.ensure(t, true) // previous = 1
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "0"
	if err := e.fix.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if e.value() != "0" || !strings.Contains(e.logs.String(), "someone else changed") {
		t.Fatalf("value %q, logs %s", e.value(), e.logs)
	}
}

func TestMemoryOnlyState(t *testing.T) {
	e := newEnv(t, "0", map[string]any{"stateDir": ""})
	e.ensure(t, true)
	if entries, _ := os.ReadDir(e.dir); len(entries) != 0 {
		t.Fatalf("stateDir \"\" wrote %v", entries)
	}
	if err := e.fix.Revert(ctx); err != nil || e.value() != "0" {
		t.Fatalf("in-process revert: %v %q", err, e.value())
	}
}

func TestErrorsChangeNothing(t *testing.T) {
	// No nf_conntrack: the sysctl does not exist.
	e := newEnv(t, "", nil)
	if _, err := e.fix.Ensure(ctx, testkit.Snapshot(), true); err == nil || !strings.Contains(err.Error(), "nf_conntrack") {
		t.Fatalf("missing sysctl: %v", err)
	}
	// The state cannot be written: the sysctl must not change (its old value would be lost).
	e = newEnv(t, "0", nil)
	blocker := filepath.Join(e.dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e.restart(t, map[string]any{"stateDir": filepath.Join(blocker, "sub")})
	if _, err := e.fix.Ensure(ctx, testkit.Snapshot(), true); err == nil || e.value() != "0" {
		t.Fatalf("unwritable state dir: err=%v value=%q", err, e.value())
	}
	// A damaged state file is an error naming it, not a guess.
	e = newEnv(t, "1", nil)
	if err := os.WriteFile(filepath.Join(e.dir, StateFile), []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.fix.Revert(ctx); err == nil || !strings.Contains(err.Error(), StateFile) || e.value() != "1" {
		t.Fatalf("damaged state: err=%v value=%q", err, e.value())
	}
}

func TestConfigErrors(t *testing.T) {
	e := newEnv(t, "0", nil)
	for _, tc := range []struct {
		options map[string]any
		want    string
	}{
		{map[string]any{"stateDir": "run/nnm"}, "fixes.conntrack-liberal.stateDir"},
		{map[string]any{"value": 1}, "value"},
	} {
		if err := e.fix.Configure(tc.options); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Configure(%v) = %v, want an error naming %s", tc.options, err, tc.want)
		}
	}
	// The rejected configurations left the state directory in force.
	e.ensure(t, true)
	if _, ok := e.stateFile(); !ok {
		t.Error("a rejected Configure changed stateDir")
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, "0", nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if e.fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q): invalid-drop is the default strategy", mode)
		}
	}
	if e.fix.Needs() != (fix.Needs{}) || e.fix.ID() != ID || !rules.ValidFixID(ID) || e.fix.Description() == "" {
		t.Error("bad needs, id or description")
	}
	if _, a, err := fix.As(e.fix); a == nil || err != nil {
		t.Errorf("fix.As: actuator %v, error %v; want an Actuator and nothing else (no Rules)", a, err)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, "0", nil)
	want := func(exp string) {
		t.Helper()
		if err := testutil.GatherAndCompare(e.reg, strings.NewReader(exp), "nnm_conntrack_liberal_value", "nnm_conntrack_liberal_previous_value"); err != nil {
			t.Error(err)
		}
	}
	const value = "# HELP nnm_conntrack_liberal_value Current value of net.netfilter.nf_conntrack_tcp_be_liberal (absent when it cannot be read).\n# TYPE nnm_conntrack_liberal_value gauge\n"
	const prev = "# HELP nnm_conntrack_liberal_previous_value Value the fix restores when it is disabled (absent when nothing is owed).\n# TYPE nnm_conntrack_liberal_previous_value gauge\n"
	want(value + "nnm_conntrack_liberal_value 0\n")
	e.ensure(t, true)
	want(prev + "nnm_conntrack_liberal_previous_value 0\n" + value + "nnm_conntrack_liberal_value 1\n")
	// Someone resets it: the metric shows it at once, before the next resync repairs it.
	e.sys.Values[sysctl.ConntrackTCPBeLiberal] = "0"
	want(prev + "nnm_conntrack_liberal_previous_value 0\n" + value + "nnm_conntrack_liberal_value 0\n")
	delete(e.sys.Values, sysctl.ConntrackTCPBeLiberal)
	want(prev + "nnm_conntrack_liberal_previous_value 0\n")

	testkit.Promlint(t, e.reg)
}

// TestWithInvalidDropThroughTheEngine runs both strategies in the real engine: while
// conntrack-liberal holds the sysctl at 1, invalid-drop reports its drop redundant. Then the agent
// restarts with conntrack-liberal disabled: the engine reverts it at start-up (the previous value
// comes from the state file), and invalid-drop sees the drop is needed again.
func TestWithInvalidDropThroughTheEngine(t *testing.T) {
	sys := sysctl.NewFake(map[string]string{sysctl.ConntrackTCPBeLiberal: "0"})
	stateDir := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	type agent struct {
		e   *engine.Engine
		be  *testkit.FakeBackend
		reg *prometheus.Registry
		m   *metrics.Sync
	}
	start := func(enabled bool) agent {
		a := agent{be: testkit.NewFakeBackend(), reg: prometheus.NewRegistry()}
		cl, err := New(Params{Sysctl: sys, Registry: a.reg, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		id, err := invaliddrop.New(invaliddrop.Params{Backend: a.be, Registry: a.reg, Sysctl: sys, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		src, err := watch.ParseFile("none", nil)
		if err != nil {
			t.Fatal(err)
		}
		c := config.Defaults()
		c.Fixes = map[string]map[string]any{ID: {"enabled": enabled, "stateDir": stateDir}}
		a.m = metrics.NewSync(a.reg)
		a.e, err = engine.New(engine.Options{Fixes: []fix.Fix{id, cl}, Backend: a.be, Source: src, Config: &c, Metrics: a.m, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	redundant := func(reg *prometheus.Registry) float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "nnm_invalid_drop_redundant" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	value := func() string { v, _ := sys.Get(sysctl.ConntrackTCPBeLiberal); return v }

	a := start(true)
	if a.e.SyncOnce(ctx, true) {
		t.Fatalf("sync failed: %+v", a.e.Statuses())
	}
	if value() != "1" || redundant(a.reg) != 1 {
		t.Fatalf("both enabled: sysctl %q, nnm_invalid_drop_redundant %v", value(), redundant(a.reg))
	}
	if a.be.Ruleset(invaliddrop.ID, rules.IPv4) == nil || a.be.Ruleset(ID, rules.IPv4) != nil {
		t.Fatalf("backend holds:\n%s", a.be.Dump())
	}
	if v := testutil.ToFloat64(a.m.Syncs.WithLabelValues(ID, fix.NodeBackend)); v != 1 {
		t.Fatalf("nnm_syncs_total{fix=%q,backend=node} = %v", ID, v)
	}

	b := start(false)
	if err := b.e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.e.Stop(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for value() != "0" || redundant(b.reg) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("restart with conntrack-liberal disabled: sysctl %q, nnm_invalid_drop_redundant %v", value(), redundant(b.reg))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(stateDir, StateFile)); err == nil {
		t.Error("the state file survived the revert")
	}
}

// TestREADMEFacts checks what the README says about this fix beyond what the central
// fixes.TestFixes checks: it is enabled in the example, and the names it cites are current.
func TestREADMEFacts(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	if r.Enabled == nil || !*r.Enabled {
		t.Error("the README example should enable the fix (it is off by default)")
	}
	r.DocumentsMetrics(t, "nnm_sync_repairs_total", "nnm_invalid_drop_redundant") // the engine's and invalid-drop's, cited
	r.Contains(t, "the state file name", StateFile)
	r.Contains(t, "the default state directory", DefaultStateDir)
	r.Contains(t, "the sysctl", sysctl.ConntrackTCPBeLiberal)
}
