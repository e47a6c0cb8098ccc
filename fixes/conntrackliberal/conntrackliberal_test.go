package conntrackliberal

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// The fix reads nothing from the cluster: the unit tests run it against nodestate.FakeSysctl and a state
// directory under t.TempDir(); kernel_test.go runs it against the real /proc/sys of a throwaway
// network namespace.

var ctx = context.Background()

// env is testkit's FixEnv with the state directory: a fresh one unless options say otherwise.
type env struct {
	*testkit.FixEnv[*Fix]
	dir string
}

// newEnv builds the fix with the sysctl at value ("" for a kernel without nf_conntrack).
func newEnv(t *testing.T, value string, options map[string]any) *env {
	t.Helper()
	e := &env{dir: t.TempDir()}
	e.FixEnv = testkit.NewFixEnv(t, New, e.options(options))
	if value != "" {
		e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = value
	}
	return e
}

// restart builds a new Fix on the same sysctl and state directory, as an agent restart does.
func (e *env) restart(options map[string]any) { e.Restart(e.options(options)) }

func (e *env) options(options map[string]any) map[string]any {
	opts := map[string]any{"stateDir": e.dir}
	maps.Copy(opts, options)
	return opts
}

func (e *env) value() string { return e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] }

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
	if res := e.Ensure(nil, true); !res.Changed || res.Repaired || e.value() != "1" {
		t.Fatalf("first Ensure: %+v, value %q", res, e.value())
	}
	if r, ok := e.stateFile(); !ok || r.Previous != "0" || r.Sysctl != nodestate.ConntrackTCPBeLiberal {
		t.Fatalf("state file: %+v %v", r, ok)
	}
	// Nothing to do: no write, neither in a normal nor in a full pass.
	e.Ensure(nil, false)
	if res := e.Ensure(nil, true); res.Changed || res.Repaired || e.Sysctl.Writes != 1 {
		t.Fatalf("idempotent Ensure: %+v, %d writes", res, e.Sysctl.Writes)
	}
	// Someone resets it: a normal pass trusts its last Ensure, a full pass repairs.
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "0"
	if res := e.Ensure(nil, false); res.Repaired || e.value() != "0" {
		t.Fatalf("a normal pass must not re-read the sysctl: %+v", res)
	}
	if res := e.Ensure(nil, true); !res.Repaired || e.value() != "1" {
		t.Fatalf("full pass: %+v, value %q", res, e.value())
	}
	if r, _ := e.stateFile(); r.Previous != "0" {
		t.Fatalf("a repair must not overwrite the remembered value: %+v", r)
	}
	// Disabled: the old value comes back and the record goes.
	if err := e.Fix.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.stateFile(); ok || e.value() != "0" {
		t.Fatalf("after Revert: value %q, state file kept: %v", e.value(), ok)
	}
	writes := e.Sysctl.Writes
	if err := e.Fix.Revert(ctx); err != nil || e.Sysctl.Writes != writes {
		t.Fatalf("a second Revert must be a no-op: %v, %d writes", err, e.Sysctl.Writes-writes)
	}
	// Enabled again: remembers afresh.
	if res := e.Ensure(nil, false); !res.Changed || e.value() != "1" {
		t.Fatalf("re-enabled: %+v", res)
	}
}

func TestRestartWhileEnabled(t *testing.T) {
	e := newEnv(t, "0", nil)
	e.Ensure(nil, true)
	// The agent restarts: the new process finds 1 (its own) and the record.
	e.restart(nil)
	if res := e.Ensure(nil, true); res.Changed || res.Repaired {
		t.Fatalf("after restart: %+v", res)
	}
	if r, _ := e.stateFile(); r.Previous != "0" {
		t.Fatalf("restart forgot the previous value: %+v", r)
	}
	// Reset while the agent was down: a repair, and the previous value is still the original one.
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "0"
	e.restart(nil)
	if res := e.Ensure(nil, true); !res.Repaired || e.value() != "1" {
		t.Fatalf("reset during restart: %+v", res)
	}
	// Restarted with the fix disabled: the engine reverts at start-up.
	e.restart(nil)
	if err := e.Fix.Revert(ctx); err != nil || e.value() != "0" {
		t.Fatalf("revert after restart: %v, value %q", err, e.value())
	}
}

func TestAlreadyLiberalIsLeftAlone(t *testing.T) {
	// kube-proxy --conntrack-tcp-be-liberal got there first: nothing to write, nothing to undo.
	e := newEnv(t, "1", nil)
	if res := e.Ensure(nil, true); res.Changed || e.Sysctl.Writes != 0 {
		t.Fatalf("%+v, %d writes", res, e.Sysctl.Writes)
	}
	if err := e.Fix.Revert(ctx); err != nil || e.value() != "1" || e.Sysctl.Writes != 0 {
		t.Fatalf("Revert changed a value that was never ours: %v %q", err, e.value())
	}
}

func TestRevertLeavesSomeoneElsesValue(t *testing.T) {
	e := newEnv(t, "1", nil)
	e.Ensure(nil, true) // previous = 1
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "0"
	if err := e.Fix.Revert(ctx); err != nil {
		t.Fatal(err)
	}
	if e.value() != "0" || !strings.Contains(e.Logs.String(), "someone else changed") {
		t.Fatalf("value %q, logs %s", e.value(), e.Logs)
	}
}

func TestMemoryOnlyState(t *testing.T) {
	e := newEnv(t, "0", map[string]any{"stateDir": ""})
	e.Ensure(nil, true)
	if entries, _ := os.ReadDir(e.dir); len(entries) != 0 {
		t.Fatalf("stateDir \"\" wrote %v", entries)
	}
	if err := e.Fix.Revert(ctx); err != nil || e.value() != "0" {
		t.Fatalf("in-process revert: %v %q", err, e.value())
	}
}

func TestErrorsChangeNothing(t *testing.T) {
	// No nf_conntrack: the sysctl does not exist.
	e := newEnv(t, "", nil)
	if _, err := e.Fix.Ensure(ctx, testkit.Snapshot(), true); err == nil || !strings.Contains(err.Error(), "nf_conntrack") {
		t.Fatalf("missing sysctl: %v", err)
	}
	// The state cannot be written: the sysctl must not change (its old value would be lost).
	e = newEnv(t, "0", nil)
	blocker := filepath.Join(e.dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	e.restart(map[string]any{"stateDir": filepath.Join(blocker, "sub")})
	if _, err := e.Fix.Ensure(ctx, testkit.Snapshot(), true); err == nil || e.value() != "0" {
		t.Fatalf("unwritable state dir: err=%v value=%q", err, e.value())
	}
	// A damaged state file is an error naming it, not a guess.
	e = newEnv(t, "1", nil)
	if err := os.WriteFile(filepath.Join(e.dir, StateFile), []byte("{garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Fix.Revert(ctx); err == nil || !strings.Contains(err.Error(), StateFile) || e.value() != "1" {
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
		e.ConfigureFails(nil, tc.options, tc.want)
	}
	// The rejected configurations left the state directory in force.
	e.Ensure(nil, true)
	if _, ok := e.stateFile(); !ok {
		t.Error("a rejected Configure changed stateDir")
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, "0", nil)
	for _, mode := range []string{"", "ipvs", "iptables", "nftables"} {
		if e.Fix.DefaultEnabled(fix.Env{ProxyMode: mode}) {
			t.Errorf("DefaultEnabled(%q): invalid-drop is the default strategy", mode)
		}
	}
	if testkit.Reads(e.Fix) != "" || e.Fix.ID() != ID || !rules.ValidFixID(ID) || e.Fix.Description() == "" {
		t.Error("bad needs, id or description")
	}
	if _, a, err := fix.As(e.Fix); a == nil || err != nil {
		t.Errorf("fix.As: actuator %v, error %v; want an Actuator and nothing else (no Rules)", a, err)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, "0", nil)
	want := func(value, previous string) {
		t.Helper()
		if got := e.Metric("nnm_conntrack_liberal_value"); got != value {
			t.Errorf("nnm_conntrack_liberal_value %q, want %q", got, value)
		}
		if got := e.Metric("nnm_conntrack_liberal_previous_value"); got != previous {
			t.Errorf("nnm_conntrack_liberal_previous_value %q, want %q", got, previous)
		}
	}
	want("0", "")
	e.Ensure(nil, true)
	want("1", "0")
	// Someone resets it: the metric shows it at once, before the next resync repairs it.
	e.Sysctl.Values[nodestate.ConntrackTCPBeLiberal] = "0"
	want("0", "0")
	delete(e.Sysctl.Values, nodestate.ConntrackTCPBeLiberal)
	want("", "0")

	testkit.Promlint(t, e.Registry)
}

// TestWithInvalidDropThroughTheEngine runs both strategies in the real engine: while
// conntrack-liberal holds the sysctl at 1, invalid-drop reports its drop redundant. Then the agent
// restarts with conntrack-liberal disabled: the engine reverts it at start-up (the previous value
// comes from the state file), and invalid-drop sees the drop is needed again.
func TestWithInvalidDropThroughTheEngine(t *testing.T) {
	sys := nodestate.NewFakeSysctl(map[string]string{nodestate.ConntrackTCPBeLiberal: "0"})
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
		cl, err := New(fix.Params{Sysctl: sys, Registry: a.reg, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		id, err := invaliddrop.New(fix.Params{Backend: a.be, Registry: a.reg, Sysctl: sys, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		c := config.Defaults()
		c.Fixes = map[string]map[string]any{ID: {"enabled": enabled, "stateDir": stateDir}}
		a.m = metrics.NewSync(a.reg)
		a.e, err = engine.New(engine.Options{Fixes: []fix.Fix{id, cl}, Backend: a.be, Hub: watch.Offline(quiet), Config: &c, Metrics: a.m, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	redundant := func(reg *prometheus.Registry) float64 {
		v, ok := testkit.Value(t, reg, "nnm_invalid_drop_redundant")
		if !ok {
			return -1
		}
		return v
	}
	value := func() string { v, _ := sys.Get(nodestate.ConntrackTCPBeLiberal); return v }

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
	agenttest.Eventually(t, 5*time.Second, func() error {
		if value() != "0" || redundant(b.reg) != 0 {
			return fmt.Errorf("restart with conntrack-liberal disabled: sysctl %q, nnm_invalid_drop_redundant %v", value(), redundant(b.reg))
		}
		return nil
	})
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
	r.Contains(t, "the sysctl", nodestate.ConntrackTCPBeLiberal)
}
