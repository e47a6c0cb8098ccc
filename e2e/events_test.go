package e2e

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/events"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

const fixLiberal = "conntrack-liberal"

// eventsTimeout bounds how long an Event takes to reach the API server: client-go's broadcaster
// writes asynchronously and, when a series patch races the create, retries after ~10s.
const eventsTimeout = 30 * time.Second

// nodeEvents lists the Events on the Node name (events.k8s.io/v1; a Node's Events are in default).
func nodeEvents(t *testing.T, c *cluster, name string) []eventsv1.Event {
	t.Helper()
	l, err := c.admin.EventsV1().Events("default").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range l.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// summary is "Reason action" per Event, sorted, for messages and comparisons.
func summary(evs []eventsv1.Event) []string {
	var out []string
	for _, e := range evs {
		s := e.Reason + " " + e.Action
		if e.Series != nil {
			s += fmt.Sprintf(" (series %d)", e.Series.Count)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// waitOneSeries waits until the node has exactly one Event of reason, with a series: its repeats
// were merged into it.
func waitOneSeries(t *testing.T, c *cluster, n *node, reason string) {
	t.Helper()
	agenttest.Eventually(t, eventsTimeout, func() error {
		got := withReason(nodeEvents(t, c, n.name), reason)
		if len(got) != 1 || got[0].Series == nil {
			return fmt.Errorf("want one %s Event with a series, got %q", reason, summary(got))
		}
		return nil
	})
}

func withReason(evs []eventsv1.Event, reason string) []eventsv1.Event {
	var out []eventsv1.Event
	for _, e := range evs {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// TestNodeEvents runs the agent against the real API server with deploy/base's RBAC and reads the
// Events it posts on its Node:
//   - lifecycle: a predecessor's NMANAGER_ chains in the node, two fixes enabled → FixEnabled and
//     FixSynced for each, PredecessorTakenOver; a reload disabling invalid-drop → FixDisabled;
//     then a storm of 20 config files that do not load within 8s → one ConfigReloadRejected Event
//     whose series counts at most events.Burst occurrences (the API server saw a create and a
//     patch), 17 suppressed by the agent's limit, while the agent logged and counted all 20.
//   - failing: conntrack-liberal failing every sync (its sysctl missing) → one FixSyncFailed Event
//     (series of at most events.Burst) for many failed syncs, the rest suppressed by the agent.
//   - refused: kube-proxy in iptables mode with the DNAT fix enabled → FixRefused (Warning).
func TestNodeEvents(t *testing.T) {
	c := sharedCluster(t, "iptables")
	t.Run("lifecycle", func(t *testing.T) {
		t.Parallel()
		n := startNode(t, c, "iptables", nodeOptions{setup: addPredecessorChains})
		want := []string{
			events.FixEnabled + " " + fixDrop, events.FixEnabled + " " + fixExtIP,
			events.FixSynced + " " + fixDrop, events.FixSynced + " " + fixExtIP,
			events.PredecessorTakenOver + " " + events.ActionTakeOver,
		}
		slices.Sort(want)
		agenttest.Eventually(t, eventsTimeout, func() error {
			if got := summary(nodeEvents(t, c, n.name)); !slices.Equal(got, want) {
				return fmt.Errorf("Events on node %s: %q, want %q", n.name, got, want)
			}
			return nil
		})
		for _, e := range nodeEvents(t, c, n.name) {
			if string(e.Regarding.UID) != n.name || e.ReportingController != events.Controller || e.Type != "Normal" {
				t.Errorf("event %s: regarding %+v, controller %q, type %s", e.Reason, e.Regarding, e.ReportingController, e.Type)
			}
			t.Logf("%s %s %s: %s", e.Type, e.Reason, e.Action, e.Note)
		}

		n.writeConfig(strings.Replace(defaultConfig, "invalid-drop:\n    enabled: true", "invalid-drop:\n    enabled: false", 1))
		agenttest.Eventually(t, eventsTimeout, func() error {
			if len(withReason(nodeEvents(t, c, n.name), events.FixDisabled)) != 1 {
				return fmt.Errorf("no FixDisabled yet: %q", summary(nodeEvents(t, c, n.name)))
			}
			return nil
		})

		const storm = 20
		before, _ := n.metrics().Value("nnm_config_reloads_total", "result", "error")
		// Each file is written only after the previous one was loaded (the counter rose), so no two
		// writes fall into one reload debounce however slow the machine is.
		for i := range storm {
			n.writeConfig(fmt.Sprintf("fixes: [not a map %d\n", i))
			agenttest.Eventually(t, converge, func() error {
				if v, _ := n.metrics().Value("nnm_config_reloads_total", "result", "error"); v-before < float64(i+1) {
					return fmt.Errorf("nnm_config_reloads_total{result=error} rose by %v after %d files, want %d", v-before, i+1, i+1)
				}
				return nil
			})
		}
		waitOneSeries(t, c, n, events.ConfigReloadRejected)
		time.Sleep(3 * time.Second) // anything else the storm would write
		rej := withReason(nodeEvents(t, c, n.name), events.ConfigReloadRejected)
		if len(rej) != 1 || rej[0].Series == nil || rej[0].Series.Count < 2 || rej[0].Series.Count > events.Burst {
			t.Fatalf("a storm of %d rejected reloads: Events %q, want one with a series of 2..%d", storm, summary(rej), events.Burst)
		}
		if rej[0].Type != "Warning" || !strings.Contains(rej[0].Note, "not valid YAML") {
			t.Errorf("ConfigReloadRejected: type %s, note %q", rej[0].Type, rej[0].Note)
		}
		if got := strings.Count(n.agent.Logs(), "config file changed but does not load"); got < storm {
			t.Errorf("the agent logged %d rejected reloads, want %d (every one is logged; only the Events are bounded)", got, storm)
		}
		// The Recorder's own bound: of the 20, Burst went to client-go's broadcaster (which merged them
		// into the one series), the others were suppressed before it.
		suppressed := `msg="node event suppressed (rate limit)" reason=` + events.ConfigReloadRejected
		if got := strings.Count(n.agent.Logs(), suppressed); got != storm-events.Burst {
			t.Errorf("the agent suppressed %d ConfigReloadRejected Events, want %d of %d", got, storm-events.Burst, storm)
		}
		if strings.Contains(n.agent.Logs(), "forbidden") {
			t.Errorf("a request was forbidden with deploy/base's RBAC:\n%s", n.agent.LogTail(30))
		}
		t.Logf("storm of %d rejected reloads: Events on the node %q", storm, summary(nodeEvents(t, c, n.name)))
	})
	t.Run("failing", func(t *testing.T) {
		t.Parallel()
		// conntrack-liberal cannot read its sysctl under an empty procSysPath: every sync fails and is
		// retried with backoff (minSyncPeriod doubling up to syncPeriod).
		cfg := defaultConfig + "  conntrack-liberal:\n    enabled: true\n"
		n := startNode(t, c, "iptables", nodeOptions{config: cfg, noWait: true, args: []string{"--proc-sys-path", t.TempDir()}})
		const failures = 8
		agenttest.Eventually(t, 2*readyTimeout, func() error {
			if v := n.metrics().Sum("nnm_sync_errors_total", "fix", fixLiberal); v < failures {
				return fmt.Errorf("nnm_sync_errors_total{fix=%s} = %v, want ≥ %d", fixLiberal, v, failures)
			}
			return nil
		})
		waitOneSeries(t, c, n, events.FixSyncFailed)
		failed := withReason(nodeEvents(t, c, n.name), events.FixSyncFailed)
		if f := failed[0]; f.Action != fixLiberal || f.Type != "Warning" || f.Series.Count > events.Burst || !strings.Contains(f.Note, "nf_conntrack_tcp_be_liberal") {
			t.Errorf("FixSyncFailed: action %s type %s series %+v note %q", f.Action, f.Type, f.Series, f.Note)
		}
		errs := n.metrics().Sum("nnm_sync_errors_total", "fix", fixLiberal)
		suppressed := strings.Count(n.agent.Logs(), `msg="node event suppressed (rate limit)" reason=`+events.FixSyncFailed)
		if suppressed < failures-events.Burst {
			t.Errorf("%v failed syncs, %d FixSyncFailed suppressed; want at least %d suppressed", errs, suppressed, failures-events.Burst)
		}
		if synced := withReason(nodeEvents(t, c, n.name), events.FixSynced); len(synced) != 2 {
			t.Errorf("want FixSynced for the two fixes that work, got %q", summary(synced))
		}
		t.Logf("%v failed syncs of %s: Events %q; %d suppressed by the agent", errs, fixLiberal, summary(failed), suppressed)
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		n := startNode(t, c, "iptables", nodeOptions{args: []string{"--proxy-mode", "iptables"}})
		agenttest.Eventually(t, eventsTimeout, func() error {
			got := withReason(nodeEvents(t, c, n.name), events.FixRefused)
			if len(got) != 1 || got[0].Action != fixExtIP || got[0].Type != "Warning" {
				return fmt.Errorf("want one FixRefused Warning for %s, got %q", fixExtIP, summary(nodeEvents(t, c, n.name)))
			}
			t.Logf("%s %s %s: %s", got[0].Type, got[0].Reason, got[0].Action, got[0].Note)
			return nil
		})
	})
}

// addPredecessorChains leaves what Kakao's network-node-manager leaves: an NMANAGER_ chain jumped to
// from INPUT, in every iptables variant installed (the agent takes over in the one it detects).
func addPredecessorChains(t *testing.T, ns *netns.NS) {
	var errs []error
	added := 0
	for _, bin := range []string{"iptables-legacy", "iptables-nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		for _, args := range [][]string{
			{"-t", "filter", "-N", "NMANAGER_DROP_INVALID_INPUT"},
			{"-t", "filter", "-I", "INPUT", "-j", "NMANAGER_DROP_INVALID_INPUT"},
		} {
			if _, err := ns.Exec(append([]string{bin}, args...)...); err != nil {
				errs = append(errs, err)
			}
		}
		added++
	}
	if added == 0 {
		errs = append(errs, errors.New("neither iptables-legacy nor iptables-nft is installed"))
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
