package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrExitedZero is wrapped by Process.Exited when the program ended on its own with status 0: for a
// daemon under test that is an exit all the same.
var ErrExitedZero = errors.New("exited with status 0")

// Process is one program run in a network namespace (`ip netns exec`, which execs it, so the pid is
// the program's) for a test: the agent, kube-proxy, Felix. It runs in a process group of its own (a
// ^C to the test does not reach it before the test's cleanup stops it) and gets SIGKILL if the test
// process dies first, so a crashed test leaves nothing running. Its stdout and stderr are appended to
// a log file, framed by a line saying what was started and one saying how it ended.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd

	done chan struct{} // closed once the program has been reaped
	mu   sync.Mutex
	err  error // how it ended, once done is closed
}

// StartProcess starts argv in namespace netns as the program called name (in messages), with env added
// to base (the environment: nil means this process's), stdout and stderr appended to logPath.
func StartProcess(netns, name, logPath string, base, env []string, argv ...string) (*Process, error) {
	return StartProcessFiles(netns, name, logPath, base, env, nil, argv...)
}

// StartProcessFiles is StartProcess with files the program inherits as fd 3, 4, ... (exec.Cmd's
// ExtraFiles; `ip netns exec` passes them on).
func StartProcessFiles(netns, name, logPath string, base, env []string, files []*os.File, argv ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	if base == nil {
		base = os.Environ()
	}
	envNote := ""
	if len(env) > 0 {
		envNote = "env " + strings.Join(env, " ") + " "
	}
	fmt.Fprintf(logf, "==== %s: ip netns exec %s %s%s\n", time.Now().Format(time.RFC3339Nano), netns, envNote, strings.Join(argv, " "))
	cmd := Command(context.Background(), netns, argv...)
	cmd.Env = append(base, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logf, "==== %s: %s exited: %v\n", time.Now().Format(time.RFC3339Nano), name, err)
		logf.Close()
		if err == nil {
			err = fmt.Errorf("%s %w", name, ErrExitedZero)
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// PID is the program's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited returns how the program ended (ErrExitedZero wrapped when with status 0), or nil while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	default:
		return nil
	}
}

// Signal sends sig to the program and waits up to grace for it to end; then it kills the program's
// process group and says so in the error. Signalling a program that ended is a no-op.
func (p *Process) Signal(sig syscall.Signal, grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %v after %v; killed", p.name, grace, sig)
	}
}

// LogPath is the file holding the program's output.
func (p *Process) LogPath() string { return p.logPath }

// Logs returns the whole log file (every run that appended to it).
func (p *Process) Logs() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// LogTail returns the last n lines of the log file.
func (p *Process) LogTail(n int) string { return LogTail(p.Logs(), n) }

// LogWarnings returns the last n lines of log that the agent's logger (log/slog) wrote at level WARN
// or ERROR, but for "probe failing" (every start logs it until the first sync): what went wrong in a
// log whose tail a debug level fills with chatter.
func LogWarnings(log string, n int) string {
	var out []string
	for l := range strings.Lines(log) {
		if (strings.Contains(l, " level=WARN ") || strings.Contains(l, " level=ERROR ")) && !strings.Contains(l, ` msg="probe failing"`) {
			out = append(out, strings.TrimRight(l, "\n"))
		}
	}
	return strings.Join(out[max(len(out)-n, 0):], "\n")
}

// LogTail returns the last n lines of log.
func LogTail(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
