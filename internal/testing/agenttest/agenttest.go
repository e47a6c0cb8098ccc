// Package agenttest runs the real agent binary (bin/network-node-manager) as a separate process inside a
// "node" network namespace, for end-to-end tests, benchmarks and the demo:
//
//	a := agenttest.StartT(t, agenttest.Options{Netns: ns.Name, Args: []string{"--kubeconfig", kc, ...}})
//	a.WaitReadyT(t, 30*time.Second)
//	m := a.MetricsT(t)                          // parsed /metrics
//	v, _ := m.Value("nnm_rules_programmed", "fix", "invalid-drop", "family", "ipv4")
//	out := agenttest.IptablesSave(t, ns.Name, "ipv4", "nat")
//
// The agent is started with `ip netns exec <netns> <bin> run <args>`; its metrics server listens on
// 127.0.0.1:<MetricsPort> inside that namespace and is reached by dialing from a thread that entered it.
// Stdout and stderr go to a log file whose tail StartT prints when the test fails. Stop sends SIGTERM
// (the agent leaves its rules in the kernel, as in production); Kill sends SIGKILL.
package agenttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// BinEnv overrides the path of the agent binary.
const BinEnv = "NNM_AGENT_BIN"

// DefaultMetricsPort is the port the agent's metrics server gets inside its netns when Options.MetricsPort
// is 0. Every test has a netns of its own, so a fixed port never collides.
const DefaultMetricsPort = 9484

// ErrUnavailable is wrapped by the errors of Binary and CheckPrerequisites: tests skip on it.
var ErrUnavailable = errors.New("agent unavailable")

// Binary returns the agent binary: $NNM_AGENT_BIN, else <repo>/bin/network-node-manager.
func Binary() (string, error) {
	path := os.Getenv(BinEnv)
	if path == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		path = filepath.Join(root, "bin", "network-node-manager")
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%w: agent binary %s: %v; run `make build` or set %s", ErrUnavailable, path, err, BinEnv)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: agent binary %s is not executable; run `make build`", ErrUnavailable, path)
	}
	return path, nil
}

// RepoRoot is the first directory above this source file that holds a go.mod.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source tree")
	}
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if parent := filepath.Dir(dir); parent == dir {
			return "", errors.New("no go.mod above " + file)
		}
	}
}

// CheckPrerequisites reports why the agent cannot run here (not root, no `ip`, binary missing), wrapping
// ErrUnavailable, or nil.
func CheckPrerequisites() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root to run the agent in a network namespace (euid %d)", ErrUnavailable, os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: iproute2 `ip` not found: %v", ErrUnavailable, err)
	}
	_, err := Binary()
	return err
}

// Options says how to run the agent.
type Options struct {
	// Netns is the name (under /run/netns) of the namespace the agent runs in. Required.
	Netns string
	// Bin is the agent binary; default Binary().
	Bin string
	// Args follow `run`. A --metrics-address is added unless present.
	Args []string
	// Env is added to the agent's environment (which otherwise is this process's, minus NNM_* variables).
	Env []string
	// MetricsPort is the port of /metrics, /healthz, /readyz on 127.0.0.1 inside Netns; default
	// DefaultMetricsPort. Ignored when Args hold --metrics-address.
	MetricsPort int
	// LogFile receives stdout and stderr; default a file in a temporary directory (StartT: t.TempDir()).
	LogFile string
	// Cgroup, if set, is a cgroup directory (v1 or v2) the agent starts in: it joins it before it
	// execs, so everything it and its child processes (iptables-restore, nft) allocate, user and
	// kernel memory, is charged to that cgroup, as to the container's under a kubelet.
	Cgroup string
}

// Agent is one running agent process.
type Agent struct {
	opts    Options
	addr    string // host:port of the metrics server inside the netns
	logPath string
	client  *http.Client

	mu   sync.Mutex                    // held while (re)starting
	proc atomic.Pointer[netns.Process] // the current run
}

// Start starts the agent and returns without waiting for readiness (see WaitReady).
func Start(opts Options) (*Agent, error) {
	if opts.Netns == "" {
		return nil, errors.New("agenttest: Options.Netns is required")
	}
	if opts.Bin == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		opts.Bin = bin
	}
	if opts.MetricsPort == 0 {
		opts.MetricsPort = DefaultMetricsPort
	}
	addr := "127.0.0.1:" + strconv.Itoa(opts.MetricsPort)
	hasAddr := false
	for i, a := range opts.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-address="); ok {
			addr, hasAddr = v, true
		} else if a == "--metrics-address" && i+1 < len(opts.Args) {
			addr, hasAddr = opts.Args[i+1], true
		}
	}
	if !hasAddr {
		opts.Args = append(opts.Args, "--metrics-address", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	if opts.LogFile == "" {
		dir, err := os.MkdirTemp("", "nnm-agent-")
		if err != nil {
			return nil, err
		}
		opts.LogFile = filepath.Join(dir, "agent.log")
	}
	a := &Agent{opts: opts, addr: addr, logPath: opts.LogFile}
	a.client = netns.HTTPClient(opts.Netns)
	if err := a.start(); err != nil {
		return nil, err
	}
	return a, nil
}

// start launches the process (again).
func (a *Agent) start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.proc.Load(); p != nil && p.Exited() == nil {
		return errors.New("agent is already running")
	}
	argv := append([]string{a.opts.Bin, "run"}, a.opts.Args...)
	var files []*os.File
	if a.opts.Cgroup != "" {
		// The shell (the pid `ip netns exec` execs, so the agent's) moves itself through fd 3, the
		// cgroup's cgroup.procs opened here (`ip netns exec` mounts a sysfs of the namespace, without
		// the cgroup hierarchies), then execs the agent.
		procs, err := os.OpenFile(filepath.Join(a.opts.Cgroup, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("agent cgroup: %w", err)
		}
		defer procs.Close()
		files = []*os.File{procs}
		argv = append([]string{"/bin/sh", "-c", `echo $$ >&3 && exec 3>&- && exec "$@"`, "sh"}, argv...)
	}
	proc, err := netns.StartProcessFiles(a.opts.Netns, "agent", a.logPath, cleanEnv(), a.opts.Env, files, argv...)
	if err != nil {
		return err
	}
	a.proc.Store(proc)
	return nil
}

// cleanEnv is this process's environment without NNM_* variables, so that a developer's shell settings
// do not leak into the agent under test.
func cleanEnv() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NNM_") {
			env = append(env, kv)
		}
	}
	return env
}

// Exited returns the reason the process ended, or nil while it runs.
func (a *Agent) Exited() error { return a.proc.Load().Exited() }

// PID of the running process.
func (a *Agent) PID() int { return a.proc.Load().PID() }

// Netns is the namespace the agent runs in.
func (a *Agent) Netns() string { return a.opts.Netns }

// MetricsAddr is host:port of the metrics server inside the namespace.
func (a *Agent) MetricsAddr() string { return a.addr }

// LogPath is the file holding the agent's stdout and stderr (all runs, appended).
func (a *Agent) LogPath() string { return a.logPath }

// Logs returns the whole log file.
func (a *Agent) Logs() string { return a.proc.Load().Logs() }

// LogTail returns the last n lines of the log.
func (a *Agent) LogTail(n int) string { return a.proc.Load().LogTail(n) }

// LogWarnings returns the last n lines the agent logged at level WARN or ERROR (netns.LogWarnings).
func (a *Agent) LogWarnings(n int) string { return netns.LogWarnings(a.proc.Load().Logs(), n) }

// Stop sends SIGTERM and waits up to grace for the process to end, then kills it. The agent leaves its
// rules in place on exit. Stopping a stopped agent is a no-op.
func (a *Agent) Stop(grace time.Duration) error {
	p := a.proc.Load()
	if p.Exited() != nil {
		return nil
	}
	if err := p.Signal(syscall.SIGTERM, grace); err != nil {
		return err
	}
	if err := p.Exited(); !errors.Is(err, netns.ErrExitedZero) {
		return fmt.Errorf("agent exited with %v after SIGTERM", err)
	}
	return nil
}

// Kill sends SIGKILL and waits for the process to end.
func (a *Agent) Kill() error {
	return a.proc.Load().Signal(syscall.SIGKILL, 10*time.Second)
}

// Restart stops the agent (SIGTERM) if it runs and starts it again with the same options.
func (a *Agent) Restart(grace time.Duration) error {
	if err := a.Stop(grace); err != nil {
		return err
	}
	return a.start()
}

// Get fetches path (e.g. "/readyz") from the agent's metrics server inside the namespace.
func (a *Agent) Get(ctx context.Context, path string) (int, string, error) {
	return netns.Get(ctx, a.client, "http://"+a.addr+path, "")
}

// Probe returns nil if path answers 200, else an error with the status and body.
func (a *Agent) Probe(ctx context.Context, path string) error {
	code, body, err := a.Get(ctx, path)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("%s: %d %s", path, code, strings.TrimSpace(body))
	}
	return nil
}

// WaitReady polls /readyz until it answers 200, the process exits or timeout passes.
func (a *Agent) WaitReady(ctx context.Context, timeout time.Duration) error {
	return Poll(ctx, timeout, 50*time.Millisecond, func() error {
		if err := a.Exited(); err != nil {
			return Permanent(fmt.Errorf("agent exited: %w", err))
		}
		return a.Probe(ctx, "/readyz")
	})
}

// Metrics scrapes and parses /metrics.
func (a *Agent) Metrics(ctx context.Context) (Metrics, error) {
	code, body, err := a.Get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: status %d", code)
	}
	return ParseMetrics(body)
}
