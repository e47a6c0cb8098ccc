package conntrackliberal

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestKernel runs the fix against the real /proc/sys inside a throwaway network namespace. The sysctl
// is per network namespace, and /proc/sys/net resolves against the namespace of the thread that opens
// the file: inside ns.Do the fix sees (and changes) the namespace's value only. The test reads the
// value from a separate process in the namespace (ip netns exec) and checks that the host's value is
// the same before and after.
func TestKernel(t *testing.T) {
	netns.RequireKernel(t)
	ns := netns.New(t, "nnm-ctliberal")
	proc := "/proc/sys/" + strings.ReplaceAll(nodestate.ConntrackTCPBeLiberal, ".", "/")
	host, err := os.ReadFile(proc)
	if err != nil {
		netns.Unavailable(t, "the host has no %s (nf_conntrack not loaded): %v", nodestate.ConntrackTCPBeLiberal, err)
	}
	defer func() {
		if after, _ := os.ReadFile(proc); string(after) != string(host) {
			t.Errorf("THE HOST'S %s CHANGED: %q -> %q", nodestate.ConntrackTCPBeLiberal, host, after)
		}
	}()
	inNS := func() string { return strings.TrimSpace(ns.MustExec("cat", proc)) }
	if _, err := ns.Exec("cat", proc); err != nil {
		netns.Unavailable(t, "the namespace has no %s: %v", nodestate.ConntrackTCPBeLiberal, err)
	}
	ns.MustExec("sh", "-c", "echo 0 > "+proc)
	stateDir := t.TempDir()
	newFix := func() *Fix {
		f, err := New(fix.Params{Sysctl: nodestate.NewSysctl(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Configure(map[string]any{"stateDir": stateDir}); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := newFix()
	inside := func(step string, fn func() error) {
		t.Helper()
		if err := ns.Do(fn); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	// ensure runs a full pass inside the namespace; it must report what the step expects (did) and
	// leave the namespace's value at 1.
	ensure := func(step string, did func(fix.Result) bool) {
		t.Helper()
		inside(step, func() error {
			res, err := f.Ensure(ctx, testkit.Snapshot(), true)
			if err == nil && !did(res) {
				err = fmt.Errorf("Ensure did not report the %s: %+v", step, res)
			}
			return err
		})
		if got := inNS(); got != "1" {
			t.Fatalf("namespace value after %s = %q, want 1", step, got)
		}
	}
	ensure("change", func(res fix.Result) bool { return res.Changed })
	if got, _ := os.ReadFile(proc); string(got) != string(host) {
		t.Fatalf("Ensure inside the namespace changed the host: %q -> %q", host, got)
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, StateFile)); err != nil || !strings.Contains(string(b), `"previous":"0"`) {
		t.Fatalf("state file: %s %v", b, err)
	}

	// Someone resets it in the namespace; a full pass of a restarted agent repairs it.
	ns.MustExec("sh", "-c", "echo 0 > "+proc)
	f = newFix()
	ensure("repair", func(res fix.Result) bool { return res.Repaired })

	// Disabled: the value found at first is back.
	inside("disable", func() error { return f.Revert(ctx) })
	if got := inNS(); got != "0" {
		t.Fatalf("namespace value after Revert = %q, want 0", got)
	}
	if _, err := os.Stat(filepath.Join(stateDir, StateFile)); err == nil {
		t.Fatal("state file survived Revert")
	}
}
