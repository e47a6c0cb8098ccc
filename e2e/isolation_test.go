package e2e

// Issue #15 items 2 and 3: each fix starts when what it needs is ready and never waits on another
// fix's failure. The real agent binary runs in a node netns against the real kernel; the
// reachable-later case uses the real kube-apiserver.
//
// Address plan: External-IP 203.0.16.10; namespace "later-<backend>".

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/app"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

const (
	// apiDownLog starts the line watch.Informers.WrapTransport logs for a request without an answer.
	apiDownLog = "cannot reach the API server"
	// waitingForAPI is what a fix that reads the API says while its watches have not synced.
	waitingForAPI = "waiting for the watches it reads to sync"
	liberalSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
	// xtablesLockHeld is in iptables' error when another process holds the lock.
	xtablesLockHeld = "holding the xtables lock"
)

// TestAPIUnreachableAtStart (#15 item 2): the agent starts with a kubeconfig whose API server is a
// closed port on the node's loopback. invalid-drop reads nothing from the API and must be in the
// kernel within `converge`; ipvs-externalip-dnat waits and says why; the refused connections are
// logged with their cause, at most once per watch.APIErrorLogEvery.
//
// What it guards: with one sync loop for all fixes, every fix waited for the informers, so
// invalid-drop was never programmed (the kernel check fails). And client-go's streaming list
// (WatchListClient, on by default) retries "connection refused" without calling the watch error
// handler, so the agent logged nothing about the API at all (the binary of main at 31670fe wrote no
// such line in 60 s): the log check fails without watch.Informers.WrapTransport.
//
// What the probes say while one fix waits for the API: /healthz fails after 2 × syncPeriod naming
// ipvs-externalip-dnat and that it waits for its watches, never invalid-drop: it is for monitoring.
// /readyz fails the same way. /livez, the DaemonSet's liveness probe, stays 200 (the workers are
// alive), so the kubelet does not restart the agent in a loop while the node is protected.
func TestAPIUnreachableAtStart(t *testing.T) {
	requireAgent(t)
	for _, be := range backendNames {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			const server = "127.0.0.1:6443" // nothing listens there in a new netns
			start := time.Now()
			n := startNode(t, nil, be, nodeOptions{kubeconfig: unreachableKubeconfig(t, server), noWait: true})
			agenttest.Eventually(t, converge, func() error { return n.fixPresentAll(fixDrop) })
			t.Logf("%s: invalid-drop in the kernel (both families) %v after the agent started", be, time.Since(start).Round(time.Millisecond))

			n.waitUnhealthy(fixExtIP, waitingForAPI)
			n.checkIsolated(fixDrop, fixExtIP, waitingForAPI, true)
			for _, fam := range []string{"ipv4", "ipv6"} {
				if err := n.fixAbsent(fixExtIP, fam); err != nil {
					t.Errorf("ipvs-externalip-dnat programmed without its watches: %v", err)
				}
			}

			// The second line can come only after APIErrorLogEvery; it must count what it left out.
			var lines []string
			agenttest.Eventually(t, watch.APIErrorLogEvery+15*time.Second, func() error {
				lines = agenttest.Lines(n.agent.Logs(), apiDownLog)
				if len(lines) < 2 {
					return fmt.Errorf("%d %q lines so far, want a second one after %v", len(lines), apiDownLog, watch.APIErrorLogEvery)
				}
				return nil
			})
			elapsed := time.Since(start)
			logs := n.agent.Logs()
			lines = agenttest.Lines(logs, apiDownLog)
			all := len(lines) + len(agenttest.Lines(logs, "cannot list or watch the API"))
			for _, l := range lines {
				for _, want := range []string{"connection refused", server, "level=ERROR"} {
					if !strings.Contains(l, want) {
						t.Errorf("API error line does not name %q: %s", want, l)
					}
				}
			}
			if s := suppressed(t, lines[1]); s < 1 {
				t.Errorf("the second API error line left out %d failures; the informers retry more often than %v: %s", s, watch.APIErrorLogEvery, lines[1])
			}
			// One line at once, then one per APIErrorLogEvery.
			bound := 1 + int(elapsed/watch.APIErrorLogEvery)
			if len(lines) > bound {
				t.Errorf("%d %q lines in %v, want at most %d:\n%s", len(lines), apiDownLog, elapsed.Round(time.Second), bound, strings.Join(lines, "\n"))
			}
			t.Logf("%s: %d API error lines (%d %q, 2nd left out %d failures) in %v = %.1f per minute",
				be, all, len(lines), apiDownLog, suppressed(t, lines[1]), elapsed.Round(time.Second), float64(all)/elapsed.Minutes())
			// Still waiting, still alive.
			n.checkIsolated(fixDrop, fixExtIP, waitingForAPI, true)
			// SIGTERM ends the agent although its watches sleep in client-go's retry backoff.
			stop := time.Now()
			if err := n.agent.Stop(15 * time.Second); err != nil {
				t.Error(err)
			}
			t.Logf("%s: the agent stopped %v after SIGTERM", be, time.Since(stop).Round(time.Millisecond))
		})
	}
}

// TestAPIReachableLater (#15 item 2, the API server comes later): the node's link to the real
// kube-apiserver is down when the agent starts. invalid-drop is programmed at once and
// ipvs-externalip-dnat waits; once the link is up, the DNAT entry of a Service that already exists
// is programmed and the agent becomes ready and healthy.
//
// What it guards: with one sync loop waiting for every watch, invalid-drop was not programmed
// until the API server was reachable (the first check fails).
func TestAPIReachableLater(t *testing.T) {
	eachBackend(t, func(t *testing.T, c *cluster, be string) {
		svcs := newServices(t, c, "later-"+be)
		a := svcs.create(lbService("", "a"))
		svcs.setIngress("a", "203.0.16.10")

		start := time.Now()
		n := startNode(t, c, be, nodeOptions{noWait: true, setup: func(t *testing.T, ns *netns.NS) { setUplink(t, ns.Name, "down") }})
		agenttest.Eventually(t, converge, func() error { return n.fixPresentAll(fixDrop) })
		t.Logf("%s: invalid-drop in the kernel %v after the agent started without its API server", be, time.Since(start).Round(time.Millisecond))
		n.waitUnhealthy(fixExtIP, waitingForAPI)
		n.checkIsolated(fixDrop, fixExtIP, waitingForAPI, true)
		n.expectEntries(converge) // none while the API server is out of reach
		if l := agenttest.Lines(n.agent.Logs(), apiDownLog, "network is unreachable"); len(l) == 0 {
			t.Errorf("no %q line naming the cause (network is unreachable) in the log", apiDownLog)
		}

		up := time.Now()
		setUplink(t, n.ns.Name, "up")
		// client-go's list retries back off (up to 30 s); a few seconds of outage keep that short.
		took := n.expectEntries(45*time.Second, want(a, "203.0.16.10", "tcp", 80))
		t.Logf("%s: the DNAT entry in the kernel %v after the link came up (outage %v)", be, took.Round(time.Millisecond), up.Sub(start).Round(time.Millisecond))
		agenttest.Eventually(t, converge, func() error {
			return errors.Join(n.agent.Probe(t.Context(), "/readyz"), n.agent.Probe(t.Context(), "/healthz"))
		})
		n.checkSyncHealthy()
	})
}

// TestXtablesLockHeld (#15 item 3): another process holds the xtables lock. The agent runs the
// iptables backend with the legacy variant (iptables-nft ignores the lock) and gets the lock file
// from XTABLES_LOCKFILE (iptables(8): "The XTABLES_LOCKFILE environment variable can be used to
// override the default setting"), so the test never touches the host's /run/xtables.lock.
// invalid-drop needs the lock; conntrack-liberal (a sysctl of the node netns) does not. While the
// lock is held, conntrack-liberal still repairs its sysctl and stays healthy, the failure is
// reported for invalid-drop alone (/healthz, nnm_sync_errors_total), and invalid-drop recovers once
// the lock is released.
//
// What it guards: with one sync loop, conntrack-liberal's pass queued behind invalid-drop's
// iptables-restore -w, and one health for all fixes failed as a whole ("no successful sync").
func TestXtablesLockHeld(t *testing.T) {
	requireAgent(t)
	netns.Require(t, "iptables-legacy-save", "ip6tables-legacy-save")
	const be = "iptables"
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	config := fmt.Sprintf(`# written by the e2e test
fixes:
  invalid-drop:
    enabled: true
  ipvs-externalip-dnat:
    enabled: false
  conntrack-liberal:
    enabled: true
    stateDir: %s
`, t.TempDir())
	n := startNode(t, nil, be, nodeOptions{config: config, args: []string{"--iptables-variant", "legacy"},
		env: []string{"XTABLES_LOCKFILE=" + lock}})
	if n.variant != "legacy" {
		t.Fatalf("agent runs the iptables variant %q, want legacy", n.variant)
	}
	if err := n.fixPresentAll(fixDrop); err != nil {
		t.Fatal(err)
	}
	if v := n.sysctl(liberalSysctl); v != "1" {
		t.Fatalf("%s = %q after start, want 1", liberalSysctl, v)
	}

	release := holdFlock(t, lock)
	held := time.Now()
	dropErrs := n.metrics().Sum("nnm_sync_errors_total", "fix", fixDrop)
	// A writer that does not take our lock (its own XTABLES_LOCKFILE) flushes invalid-drop's chain:
	// the verify pass finds the rule gone, and the repair needs the lock.
	foreignLock := filepath.Join(t.TempDir(), "foreign.lock")
	for _, bin := range []string{"iptables-legacy", "ip6tables-legacy"} {
		if _, err := netns.Exec(t.Context(), n.ns.Name, "env", "XTABLES_LOCKFILE="+foreignLock, bin, "-w", "1", "-t", "mangle", "-F", "NNM-INVALID-INPUT"); err != nil {
			t.Fatal(err)
		}
	}
	// A foreign writer reverts the sysctl while the lock is held: conntrack-liberal repairs it.
	if _, err := netns.Exec(t.Context(), n.ns.Name, "sh", "-c", "echo 0 > "+liberalSysctl); err != nil {
		t.Fatal(err)
	}
	took := agenttest.Eventually(t, converge, func() error {
		if v := n.sysctl(liberalSysctl); v != "1" {
			return fmt.Errorf("%s = %q, want 1", liberalSysctl, v)
		}
		return nil
	})
	t.Logf("lock held: conntrack-liberal restored its sysctl in %v", took.Round(time.Millisecond))
	// The repair waits lockWait (5 s) for the lock before it fails; then /healthz names the cause.
	n.waitUnhealthy(fixDrop, xtablesLockHeld)
	n.checkIsolated(fixLiberal, fixDrop, xtablesLockHeld, false)
	if v := n.metrics().Sum("nnm_sync_errors_total", "fix", fixDrop); v <= dropErrs {
		t.Errorf("nnm_sync_errors_total{fix=%q} %v → %v while the lock was held, want an increase", fixDrop, dropErrs, v)
	}
	// Scrapes do not queue behind the repair that waits for the lock (invalid-drop's packet counters
	// are read with iptables-save, which takes no lock). Timing is logged, not asserted.
	var slowest time.Duration
	for range 10 {
		scrape := time.Now()
		n.metrics()
		slowest = max(slowest, time.Since(scrape))
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("lock held: invalid-drop sync errors %v → %v in %v; slowest of 10 /metrics scrapes %v", dropErrs,
		n.metrics().Sum("nnm_sync_errors_total", "fix", fixDrop), time.Since(held).Round(time.Millisecond), slowest.Round(time.Millisecond))

	release()
	freed := time.Now()
	agenttest.Eventually(t, converge+5*time.Second, func() error {
		return errors.Join(n.agent.Probe(t.Context(), "/healthz"), n.fixPresentAll(fixDrop))
	})
	t.Logf("lock released: /healthz 200 again after %v", time.Since(freed).Round(time.Millisecond))
	if v := n.sysctl(liberalSysctl); v != "1" {
		t.Errorf("%s = %q after the lock was released, want 1", liberalSysctl, v)
	}
}

// checkIsolated asserts that fix ok runs while fix failing does not, because of why: /livez is
// 200; /healthz fails naming failing and why, never ok; /readyz fails the same way when failing
// never synced (neverSynced), else it stays 200; ok has no sync errors and synced successfully
// within the last 2 × syncPeriod.
func (n *node) checkIsolated(ok, failing, why string, neverSynced bool) {
	n.t.Helper()
	if err := n.agent.Probe(n.t.Context(), "/livez"); err != nil {
		n.t.Errorf("/livez: %v (the DaemonSet would restart the agent)", err)
	}
	paths := []string{"/healthz"}
	if neverSynced {
		paths = append(paths, "/readyz")
	} else if err := n.agent.Probe(n.t.Context(), "/readyz"); err != nil {
		n.t.Errorf("/readyz after every fix synced once: %v", err)
	}
	for _, path := range paths {
		code, body, err := n.agent.Get(n.t.Context(), path)
		switch {
		case err != nil:
			n.t.Errorf("%s: %v", path, err)
		case code == 200:
			n.t.Errorf("%s is 200 although %s does not sync", path, failing)
		case !strings.Contains(body, "fix "+failing) || !n.says(body, failing, why):
			n.t.Errorf("%s does not say that %s fails because %q (in its body or the log): %d %s", path, failing, why, code, body)
		case strings.Contains(body, ok):
			n.t.Errorf("%s blames %s, which syncs: %s", path, ok, body)
		default:
			n.t.Logf("%s %d: %s", path, code, strings.TrimSpace(body))
		}
	}
	m := n.metrics()
	// The agent's GC goal (app.DefaultGCPercent) unless this process hands it a GOGC.
	want := float64(app.DefaultGCPercent)
	if v, set := os.LookupEnv("GOGC"); set {
		want = 100 // the runtime's default, for "" and anything unparsable
		if p, err := strconv.ParseFloat(v, 64); err == nil {
			want = p
		} else if v == "off" {
			want = -1
		}
	}
	if v, found := m.Value("go_gc_gogc_percent"); !found || v != want {
		n.t.Errorf("go_gc_gogc_percent = %v (exported %v), want %v", v, found, want)
	}
	if v := m.Sum("nnm_sync_errors_total", "fix", ok); v != 0 {
		n.t.Errorf("nnm_sync_errors_total{fix=%q} = %v, want 0", ok, v)
	}
	last, found := m.Value("nnm_last_successful_sync_timestamp_seconds", "fix", ok)
	if age := time.Since(time.Unix(0, int64(last*1e9))); !found || age > 2*syncPeriod {
		n.t.Errorf("%s: last successful sync %v ago (exported %v), want within %v", ok, age.Round(time.Millisecond), found, 2*syncPeriod)
	}
}

// waitUnhealthy waits until /healthz fails naming fix failing and why: 2 × syncPeriod after the
// engine started (or after its last success), plus the time the failing pass takes.
func (n *node) waitUnhealthy(failing, why string) {
	n.t.Helper()
	agenttest.Eventually(n.t, converge+2*syncPeriod, func() error {
		code, body, err := n.agent.Get(n.t.Context(), "/healthz")
		if err != nil || code == 200 || !strings.Contains(body, "fix "+failing) || !n.says(body, failing, why) {
			return fmt.Errorf("/healthz does not name %s and %q yet: %d %q, %v", failing, why, code, body, err)
		}
		return nil
	})
}

// says reports whether the probe body names why failing fails, or, when the cause is an error's text
// (the unauthenticated probes show only its kind, #19), whether the agent's log does.
func (n *node) says(body, failing, why string) bool {
	return strings.Contains(body, why) || len(agenttest.Lines(n.agent.Logs(), "fix="+failing, why)) > 0
}

// fixPresentAll is fixPresent for both families.
func (n *node) fixPresentAll(fixID string) error {
	return errors.Join(n.fixPresent(fixID, "ipv4"), n.fixPresent(fixID, "ipv6"))
}

// setUplink sets the link of the node netns ns to the control plane "up" or "down".
var linkIndex = regexp.MustCompile(`^[0-9]+:$`)

func setUplink(t *testing.T, ns, state string) {
	t.Helper()
	out, err := netns.Exec(t.Context(), ns, "ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	var links []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		// A link's line starts with its index ("2: name@peer: <…>"); anything else (ip's notes on
		// stderr, such as "Peer netns reference is invalid.", which a parallel test's deleted
		// namespace can cause) is no link.
		f := strings.Fields(line)
		if len(f) < 2 || !linkIndex.MatchString(f[0]) {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if name != "lo" {
			links = append(links, name)
		}
	}
	if len(links) != 1 {
		t.Fatalf("want one link besides lo in %s, got %q", ns, links)
	}
	if _, err := netns.Exec(t.Context(), ns, "ip", "link", "set", "dev", links[0], state); err != nil {
		t.Fatal(err)
	}
}

// sysctl reads a file under /proc/sys in the node netns.
func (n *node) sysctl(path string) string {
	n.t.Helper()
	out, err := netns.Exec(n.t.Context(), n.ns.Name, "cat", path)
	if err != nil {
		n.t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// unreachableKubeconfig writes a kubeconfig for https://server with a dummy token.
func unreachableKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: down
  cluster: {server: "https://%s", insecure-skip-tls-verify: true}
users:
- name: agent
  user: {token: unused}
contexts:
- name: down
  context: {cluster: down, user: agent}
current-context: down
`, server)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// holdFlock takes an exclusive flock on path, as iptables-legacy does for the xtables lock, and
// returns its release (also run at cleanup).
func holdFlock(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		t.Fatalf("flock %s: %v", path, err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			f.Close() // drops the lock
		}
	}
	t.Cleanup(release)
	return release
}

var reSuppressed = regexp.MustCompile(`suppressed=(\d+)`)

// suppressed is the count of left-out errors a rate-limited API error line reports.
func suppressed(t *testing.T, line string) int {
	t.Helper()
	m := reSuppressed.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no suppressed= in %s", line)
	}
	v, _ := strconv.Atoi(m[1])
	return v
}
