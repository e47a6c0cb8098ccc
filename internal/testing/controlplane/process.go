package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// process is one component running inside the control-plane netns through
// `ip netns exec` (which execs the binary, so the pid is the component's).
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has been reaped
	waitErr error         // valid after done is closed
}

// startProcess starts argv in netns ns in a process group of its own, with
// stdout and stderr appended to logPath. The child gets SIGKILL if the test
// process dies first, so a crashed test leaves no component running.
func startProcess(ns, name, logPath string, argv []string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	defer logFile.Close() // the child holds its own copy
	fmt.Fprintf(logFile, "==== %s starting: %s\n", time.Now().Format(time.RFC3339), strings.Join(argv, " "))

	cmd := netns.Command(context.Background(), ns, argv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exitError reports how the process ended, or nil while it runs.
func (p *process) exitError() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v\n%s", p.name, p.waitErr, p.logTail())
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	if p == nil {
		return
	}
	pgid := p.cmd.Process.Pid
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
	}
}

// logTail returns the last lines of the component's log for error messages.
func (p *process) logTail() string {
	return tailFile(p.logPath, 30)
}

func tailFile(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	parts := bytes.Split(data, []byte("\n"))
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return fmt.Sprintf("--- last %d lines of %s ---\n%s", len(parts), path, bytes.Join(parts, []byte("\n")))
}
