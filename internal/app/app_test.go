package app

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

type nodeFix struct {
	id       string
	opts     map[string]any
	reverted bool
	fail     error
}

func (f *nodeFix) ID() string                       { return f.id }
func (f *nodeFix) Description() string              { return "" }
func (f *nodeFix) DefaultEnabled(fix.Env) bool      { return false }
func (f *nodeFix) Reads() []fix.TableRef            { return nil }
func (f *nodeFix) Configure(o map[string]any) error { f.opts = o; return nil }
func (f *nodeFix) Ensure(context.Context, *fix.Snapshot, bool) (fix.Result, error) {
	return fix.Result{}, nil
}
func (f *nodeFix) Revert(context.Context) error { f.reverted = true; return f.fail }

func TestRevertNodeState(t *testing.T) {
	a := &nodeFix{id: "node-a"}
	b := &nodeFix{id: "node-b", fail: errors.New("read-only")}
	c := config.Defaults()
	c.Fixes = map[string]map[string]any{"node-a": {"enabled": false, "stateDir": "/run/x"}}
	err := RevertNodeState(context.Background(), []fix.Fix{a, b}, &c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !a.reverted || !b.reverted {
		t.Fatal("every Actuator must be reverted, enabled or not")
	}
	if a.opts["stateDir"] != "/run/x" {
		t.Fatalf("Revert must run with the configured options: %v", a.opts)
	}
	if err == nil || !strings.Contains(err.Error(), "node-b") || strings.Contains(err.Error(), "node-a") {
		t.Fatalf("err = %v", err)
	}
}

// `version` says what the binary is: version, commit, Go version and platform, every fix, every backend.
func TestVersionCommand(t *testing.T) {
	cmd := New(Build{Version: "v1.2.3", Commit: "abc1234def56"}, fixes.Standard)
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"network-node-manager v1.2.3\n", "commit: abc1234def56\n",
		"go: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
		"\n  invalid-drop ", "\n  stale-udp-conntrack ", "backends: iptables, nftables\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, out.String())
		}
	}
}

// The agent sets its own GC goal only when GOGC is not set.
func TestGCPercent(t *testing.T) {
	env := map[string]string{}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if p, ok := gcPercent(lookup); !ok || p != DefaultGCPercent {
		t.Errorf("without GOGC: gcPercent = %d, %v; want %d, true", p, ok, DefaultGCPercent)
	}
	for _, v := range []string{"100", "off", ""} {
		env["GOGC"] = v
		if p, ok := gcPercent(lookup); ok {
			t.Errorf("GOGC=%q: gcPercent = %d, true; want GOGC left alone", v, p)
		}
	}
}
