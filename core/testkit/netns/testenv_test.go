package netns

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// recorder is a testing.TB that records how a helper ended the test instead of ending it.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, format
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, format
}

func TestUnavailableSkipsLocallyAndFailsUnderCI(t *testing.T) {
	for _, tc := range []struct {
		ci, require string
		fail        bool
	}{
		{"", "", false},
		{"false", "0", false},
		{"true", "", true},
		{"", "1", true},
		{"false", "true", true},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv(RequireEnv, tc.require)
		r := &recorder{TB: t}
		Unavailable(r, "no %s here", "thing")
		if r.failed != tc.fail || r.skipped == tc.fail {
			t.Errorf("CI=%q %s=%q: failed=%v skipped=%v, want fail=%v", tc.ci, RequireEnv, tc.require, r.failed, r.skipped, tc.fail)
		}
		if Strict() != tc.fail {
			t.Errorf("CI=%q %s=%q: Strict() = %v", tc.ci, RequireEnv, tc.require, Strict())
		}
	}
}

func TestDoEntersNamespaceAndLeavesCallerAlone(t *testing.T) {
	ns := New(t, "nnmt-self")
	ns.MustExec("ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
	before, _ := os.Readlink("/proc/thread-self/ns/net")
	var inside string
	if err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		inside = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(inside, "probe0") {
		t.Fatalf("Do did not run inside %s; /proc/net/dev:\n%s", ns.Name, inside)
	}
	after, _ := os.Readlink("/proc/thread-self/ns/net")
	if before != after {
		t.Fatalf("caller's thread changed namespace: %s -> %s", before, after)
	}
	host, _ := os.ReadFile("/proc/thread-self/net/dev")
	if strings.Contains(string(host), "probe0") {
		t.Fatal("the link leaked into the host namespace")
	}
	if out, err := ns.Exec("ip", "-o", "link", "show", "probe0"); err != nil || !strings.Contains(out, "probe0") {
		t.Fatalf("Exec does not run in the namespace: %v %s", err, out)
	}
	if _, err := ns.Exec("false"); err == nil || !strings.Contains(err.Error(), ns.Name) {
		t.Fatalf("a failing command's error must name the namespace: %v", err)
	}
}

func TestDialContextReachesTheNamespaceLoopback(t *testing.T) {
	ns := New(t, "nnmt-dial")
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := DialContext(ns.Path(), nil)(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dial inside the namespace: %v", err)
	}
	c.Close()
}

func TestDeleteRemovesNamespaceAndIsIdempotent(t *testing.T) {
	Require(t)
	ctx := context.Background()
	name := "nnmt-del-" + strings.ReplaceAll(t.Name(), "/", "-")[:8]
	if err := Create(ctx, name); err != nil {
		Unavailable(t, "create namespace: %v", err)
	}
	if !Exists(name) {
		t.Fatalf("%s does not exist after Create", name)
	}
	cmd := Command(ctx, name, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until `ip netns exec` has entered the namespace and exec'd sleep.
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		return strings.TrimSpace(string(out)) != "", nil
	}); err != nil {
		t.Fatalf("the command did not appear in %s: %v", name, err)
	}
	start := time.Now()
	if err := Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // killed by Delete
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Delete did not kill what ran in the namespace (it ended after %v)", d)
	}
	if Exists(name) {
		t.Fatalf("%s still exists after Delete", name)
	}
	if err := Delete(ctx, name); err != nil {
		t.Fatalf("deleting a missing namespace: %v", err)
	}
}

// A Process logs what it started and how it ended; Exited tells a clean exit from a running one;
// Signal stops a program that handles SIGTERM and kills one that ignores it.
func TestProcessExitLogAndStop(t *testing.T) {
	ns := New(t, "nnmt-proc")
	log := t.TempDir() + "/p.log"
	p, err := StartProcess(ns.Name, "echoer", log, nil, []string{"GREETING=hi"}, "sh", "-c", "echo $GREETING")
	if err != nil {
		t.Fatal(err)
	}
	_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return p.Exited() != nil, nil
	})
	if err := p.Exited(); !errors.Is(err, ErrExitedZero) {
		t.Fatalf("Exited() = %v, want ErrExitedZero", err)
	}
	if got := p.LogTail(2); !strings.HasPrefix(got, "hi\n==== ") || !strings.Contains(got, "echoer exited: <nil>") {
		t.Errorf("log tail = %q, want the output and the exit line", got)
	}
	if !strings.Contains(p.Logs(), "env GREETING=hi sh -c") {
		t.Errorf("log does not say what was started:\n%s", p.Logs())
	}

	stubborn, err := StartProcess(ns.Name, "stubborn", log, nil, nil, "sh", "-c", "trap '' TERM; echo trap set; sleep 30 & wait")
	if err != nil {
		t.Fatal(err)
	}
	if stubborn.Exited() != nil {
		t.Fatal("Exited() of a running program is not nil")
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(stubborn.Logs(), "\ntrap set\n"), nil // the line it echoes, not the command
	}); err != nil {
		t.Fatalf("the shell did not set its trap: %v", err)
	}
	if err := stubborn.Signal(syscall.SIGTERM, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Signal to a program ignoring SIGTERM = %v, want a kill", err)
	}
	if stubborn.Exited() == nil {
		t.Error("killed program still running")
	}
}
