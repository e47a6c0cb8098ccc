// Package kubeproxytest runs the real kube-proxy (bin/kube-proxy, built from the pinned
// k8s.io/kubernetes by hack/build-controlplane.sh) beside the agent in a "node" network namespace, and
// creates the cluster objects it needs when no kubelet or controller manager runs:
//
//	kubeproxytest.CreateNode(ctx, client, "n1", "10.244.1.1")   // Node with an InternalIP, Ready
//	kp := kubeproxytest.StartT(t, kubeproxytest.Options{Netns: ns, Kubeconfig: kc, Mode: "nftables", NodeName: "n1"})
//	kp.WaitModeT(t, 60*time.Second)                              // /proxyMode answers "nftables"
//
// kube-proxy waits after "Caches are synced" until its Node has an InternalIP and a Ready condition,
// which only the status subresource sets. In a network namespace other than the initial one it must
// not touch nf_conntrack_max (writable only there), hence --conntrack-max-per-core=0 (InitialNetns
// false). kube-proxy leaves its rules in place when it stops, as in production.
package kubeproxytest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// MetricsAddr is where kube-proxy serves /proxyMode and /metrics (its default, inside its namespace).
const MetricsAddr = "127.0.0.1:10249"

// ErrUnavailable is wrapped by Binary's error when kube-proxy is not built: tests skip on it.
var ErrUnavailable = errors.New("kube-proxy unavailable")

// BinEnv names another kube-proxy binary to run instead of bin/kube-proxy: the version matrix
// (make test-kube-versions) runs the same tests beside each supported release's kube-proxy
// (hack/build-kube-proxies.sh builds bin/kube-proxy-v<release>).
const BinEnv = "NNM_KUBE_PROXY_BIN"

// Binary returns $NNM_KUBE_PROXY_BIN when set, else bin/kube-proxy next to the control plane's
// binaries ($NNM_BIN_DIR, else <repo>/bin).
func Binary() (string, error) {
	if path := os.Getenv(BinEnv); path != "" {
		if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w: %s=%s missing or not executable; run `make test-kube-versions` (hack/build-kube-proxies.sh)", ErrUnavailable, BinEnv, path)
		}
		return path, nil
	}
	dir := os.Getenv(controlplane.BinDirEnv)
	if dir == "" {
		root, err := agenttest.RepoRoot()
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		dir = filepath.Join(root, "bin")
	}
	path := filepath.Join(dir, "kube-proxy")
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s missing or not executable; run `make controlplane` (hack/build-controlplane.sh)", ErrUnavailable, path)
	}
	return path, nil
}

// Version returns the release of the kube-proxy that Binary names, as its --version prints it
// ("v1.37.2"): the matrix's tests log it and gate what a release lacks (the KubeProxyIPVS feature
// gate exists from v1.37).
func Version() (string, error) {
	bin, err := Binary()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	f := strings.Fields(string(out)) // "Kubernetes v1.37.2"
	if len(f) != 2 || !strings.HasPrefix(f[1], "v") {
		return "", fmt.Errorf("%s --version printed %q", bin, out)
	}
	return f[1], nil
}

// MinorAtLeast reports whether version ("v1.37.2") is release 1.minor or later.
func MinorAtLeast(version string, minor int) bool {
	var maj, min int
	if _, err := fmt.Sscanf(version, "v%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj > 1 || maj == 1 && min >= minor
}

// Options says how to run kube-proxy.
type Options struct {
	// Netns is the node namespace (a name under /run/netns). Required.
	Netns string
	// Kubeconfig works from inside Netns. Required.
	Kubeconfig string
	// Mode is --proxy-mode: iptables, nftables or ipvs. Required.
	Mode string
	// NodeName is --hostname-override; the Node must exist (CreateNode). Required.
	NodeName string
	// ClusterCIDR is --cluster-cidr; default "10.244.0.0/16,fd00:10:244::/56".
	ClusterCIDR string
	// InitialNetns is true when Netns is the initial network namespace (a VM's own), where kube-proxy
	// may set nf_conntrack_max; otherwise --conntrack-max-per-core=0 is added.
	InitialNetns bool
	// Args are added after the defaults (later flags win).
	Args []string
	// LogFile receives stdout and stderr; StartT defaults it into tb.TempDir().
	LogFile string
}

// Proxy is one kube-proxy process (restartable).
type Proxy struct {
	opts   Options
	bin    string
	client *http.Client

	proc atomic.Pointer[netns.Process] // the current run
}

// Start starts kube-proxy and returns without waiting (see WaitMode).
func Start(opts Options) (*Proxy, error) {
	if opts.Netns == "" || opts.Kubeconfig == "" || opts.Mode == "" || opts.NodeName == "" {
		return nil, errors.New("kubeproxytest: Netns, Kubeconfig, Mode and NodeName are required")
	}
	if opts.ClusterCIDR == "" {
		opts.ClusterCIDR = "10.244.0.0/16,fd00:10:244::/56"
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if opts.LogFile == "" {
		dir, err := os.MkdirTemp("", "nnm-kube-proxy-")
		if err != nil {
			return nil, err
		}
		opts.LogFile = filepath.Join(dir, "kube-proxy.log")
	}
	p := &Proxy{opts: opts, bin: bin, client: netns.HTTPClient(opts.Netns)}
	return p, p.start()
}

// Options are the options p was started with (to start another kube-proxy like it, e.g. in
// another mode).
func (p *Proxy) Options() Options { return p.opts }

// Args is kube-proxy's command line.
func (p *Proxy) Args() []string {
	o := p.opts
	args := []string{
		"--kubeconfig=" + o.Kubeconfig,
		"--proxy-mode=" + o.Mode,
		"--hostname-override=" + o.NodeName,
		"--cluster-cidr=" + o.ClusterCIDR,
		"--metrics-bind-address=" + MetricsAddr,
		"--v=2",
	}
	if !o.InitialNetns {
		args = append(args, "--conntrack-max-per-core=0")
	}
	return append(args, o.Args...)
}

func (p *Proxy) start() error {
	proc, err := netns.StartProcess(p.opts.Netns, "kube-proxy", p.opts.LogFile, nil, nil, append([]string{p.bin}, p.Args()...)...)
	if err != nil {
		return err
	}
	p.proc.Store(proc)
	return nil
}

// PID is the process id of the current run (its memory figures in /proc).
func (p *Proxy) PID() int { return p.proc.Load().PID() }

// Exited returns why the process ended, or nil while it runs.
func (p *Proxy) Exited() error { return p.proc.Load().Exited() }

// Stop sends SIGTERM and waits up to grace, then kills. kube-proxy's rules stay in the kernel.
func (p *Proxy) Stop(grace time.Duration) { _ = p.proc.Load().Signal(syscall.SIGTERM, grace) }

// Cleanup runs `kube-proxy --cleanup` with p's options in its namespace, after Stop: kube-proxy
// removes its rules and exits, as a kube-proxy starting in another mode removes the old mode's.
func (p *Proxy) Cleanup(ctx context.Context) error {
	out, err := netns.Exec(ctx, p.opts.Netns, append([]string{p.bin}, append(p.Args(), "--cleanup")...)...)
	if err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, out)
	}
	return nil
}

// Restart stops kube-proxy and starts it again with the same options.
func (p *Proxy) Restart(grace time.Duration) error {
	p.Stop(grace)
	return p.start()
}

// Get fetches path from kube-proxy's metrics server inside the namespace.
func (p *Proxy) Get(ctx context.Context, path string) (string, error) {
	code, body, err := netns.Get(ctx, p.client, "http://"+MetricsAddr+path, "")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s: status %d", path, code)
	}
	return body, err
}

// WaitMode waits until /proxyMode answers the configured mode and kube-proxy has synced its rules
// once (kubeproxy_sync_proxy_rules_last_timestamp_seconds is set).
func (p *Proxy) WaitMode(ctx context.Context, timeout time.Duration) error {
	return agenttest.Poll(ctx, timeout, 100*time.Millisecond, func() error {
		if err := p.Exited(); err != nil {
			return agenttest.Permanent(fmt.Errorf("kube-proxy exited: %w", err))
		}
		mode, err := p.Get(ctx, "/proxyMode")
		if err != nil {
			return err
		}
		if strings.TrimSpace(mode) != p.opts.Mode {
			return fmt.Errorf("/proxyMode = %q, want %q", mode, p.opts.Mode)
		}
		metrics, err := p.Get(ctx, "/metrics")
		if err != nil {
			return err
		}
		m, err := agenttest.ParseMetrics(metrics)
		if err != nil {
			return err
		}
		if v, ok := m.Value("kubeproxy_sync_proxy_rules_last_timestamp_seconds"); !ok || v == 0 {
			return errors.New("kube-proxy has not synced its rules yet")
		}
		return nil
	})
}

// FullSyncs returns how many full syncs (every chain and rule rewritten, as at startup, after a
// failed sync and every hour) kube-proxy made: the sample count of
// kubeproxy_sync_full_proxy_rules_duration_seconds (iptables and nftables modes). A change of the
// Node's topology labels triggers one.
func (p *Proxy) FullSyncs(ctx context.Context) (float64, error) {
	body, err := p.Get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	m, err := agenttest.ParseMetrics(body)
	if err != nil {
		return 0, err
	}
	const name = "kubeproxy_sync_full_proxy_rules_duration_seconds_count"
	v, ok := m.Value(name)
	if !ok {
		return 0, errors.New(name + " not exported")
	}
	return v, nil
}

// LogPath is the file holding kube-proxy's output (all runs).
func (p *Proxy) LogPath() string { return p.opts.LogFile }

// LogTail returns the last n lines of the log.
func (p *Proxy) LogTail(n int) string { return p.proc.Load().LogTail(n) }

// Require ends the test when kube-proxy is not built (netns.Unavailable: a skip, or a failure under
// CI, where `make controlplane` builds it).
func Require(tb testing.TB) {
	tb.Helper()
	if _, err := Binary(); err != nil {
		netns.Unavailable(tb, "%v", err)
	}
}

// StartT starts kube-proxy for a test: it ends the test when kube-proxy is not built (netns.Unavailable),
// fails when it cannot start, and stops it when the test ends, printing the log tail on failure.
func StartT(tb testing.TB, opts Options) *Proxy {
	tb.Helper()
	Require(tb)
	if opts.LogFile == "" {
		opts.LogFile = filepath.Join(tb.TempDir(), "kube-proxy.log")
	}
	p, err := Start(opts)
	if err != nil {
		tb.Fatalf("start kube-proxy: %v", err)
	}
	if v, err := Version(); err == nil {
		tb.Logf("kube-proxy %s (%s), --proxy-mode=%s", v, p.bin, opts.Mode)
	} else {
		tb.Logf("kube-proxy: %v", err)
	}
	tb.Cleanup(func() {
		p.Stop(10 * time.Second)
		if tb.Failed() {
			tb.Logf("kube-proxy log (%s), last 40 lines:\n%s", p.LogPath(), p.LogTail(40))
		}
	})
	return p
}

// WaitModeT is WaitMode that fails the test with the log tail.
func (p *Proxy) WaitModeT(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	if err := p.WaitMode(tb.Context(), timeout); err != nil {
		tb.Fatalf("kube-proxy (%s mode) not serving: %v\nlog tail:\n%s", p.opts.Mode, err, p.LogTail(40))
	}
}

// CreateNode creates (or updates) the Node kube-proxy runs for, with InternalIP addresses and a
// Ready condition set through the status subresource, as a kubelet would.
func CreateNode(ctx context.Context, c kubernetes.Interface, name string, internalIPs ...string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	got, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	got.Status.Addresses = nil
	for _, ip := range internalIPs {
		got.Status.Addresses = append(got.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	now := metav1.Now()
	got.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set status of Node %s: %w", name, err)
	}
	return nil
}
