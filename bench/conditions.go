package main

// The Node conditions' API cost at fleet size (issue #61): K agents' condition publishers (the real
// agent.NodeConditions, as `run` builds it, with the agent's ServiceAccount and deploy/base's RBAC,
// each with its own client) against the real kube-apiserver and K Nodes, through the life of a fleet:
//
//   - install: every agent's first diagnosis on a fleet without conditions;
//   - steady, healthy: a day of diagnoses every 5 minutes (DiagnosePeriod), nothing changes;
//   - steady, a lasting problem: a day in which a problem stays on every node and its summary's
//     numbers move on every run (a conntrack table at 91-99 %);
//   - rollout: every agent restarted once (a DaemonSet rollout) with the same findings;
//   - incident: a fix fails on every node at once and recovers (two transitions).
//
// Time is simulated (the publisher's clock moves 5 minutes a run), so a day takes seconds: what the
// API server receives does not depend on the wall time between runs, only on what changes. The
// requests are counted at each member's transport (verb and resource) and checked against the
// apiserver's apiserver_request_total for PATCH nodes/status.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
)

// conditionsRow is one phase's requests, summed over the K members.
type conditionsRow struct {
	phase      string
	hours      float64 // simulated hours the phase covers (0: an event, not a rate)
	gets       int64
	patches    int64
	serverSide float64 // PATCH nodes/status the apiserver counted
	took       time.Duration
}

// countingTransport counts GET nodes and PATCH nodes/status.
type countingTransport struct {
	rt            http.RoundTripper
	gets, patches *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/nodes/"):
		c.gets.Add(1)
	case r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status"):
		c.patches.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// conditionsMember is one node's agent: its Node, client and clock.
type conditionsMember struct {
	node  string
	nc    *agent.NodeConditions
	clock time.Time
}

// fleetReport is a node's diagnosis: every check ok but the two the fleet's nodes handle, and state
// for the conntrack-table check with the table's fill in its summary.
func fleetReport(conntrack diagnose.State, fill int) *diagnose.Report {
	r := &diagnose.Report{}
	for _, c := range diagnose.CheckIDs() {
		f := diagnose.Finding{Check: c, State: diagnose.OK, Summary: "nothing found"}
		switch c {
		case "invalid-replies":
			f.State, f.HandledBy, f.Summary = diagnose.Handled, "invalid-drop", "invalid-drop drops INVALID packets before the node answers them with a reset"
		case "conntrack-table":
			f.State = conntrack
			f.Summary = fmt.Sprintf("the table is %d%% full", fill)
			if conntrack == diagnose.Handled {
				f.HandledBy = "conntrack-capacity"
			}
		}
		r.Findings = append(r.Findings, f)
	}
	return r
}

func runConditions(ctx context.Context, cp *controlplane.ControlPlane, k int) ([]conditionsRow, error) {
	admin := cp.AdminClient()
	kc, err := cp.ServiceAccountKubeconfig(ctx, "kube-system", "network-node-manager", "")
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var gets, patches atomic.Int64
	start := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	members := make([]*conditionsMember, k)
	newPublisher := func(m *conditionsMember) error {
		rc, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			return err
		}
		rc.QPS, rc.Burst = 20, 40 // the agent's (agent.RestConfig)
		rc.ContentType = "application/vnd.kubernetes.protobuf"
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, &gets, &patches} })
		client, err := kube.New(rc)
		if err != nil {
			return err
		}
		if m.nc, err = agent.NewNodeConditions(client, m.node, nil, log); err != nil {
			return err
		}
		m.nc.SetClock(func() time.Time { return m.clock })
		return nil
	}
	t0 := time.Now()
	for i := range members {
		m := &conditionsMember{node: fmt.Sprintf("fleet-node-%d", i), clock: start}
		if err := kubeproxytest.CreateNode(ctx, admin, m.node, fmt.Sprintf("10.%d.%d.%d", 100+i>>16, i>>8&255, i&255)); err != nil {
			return nil, err
		}
		if err := newPublisher(m); err != nil {
			return nil, err
		}
		members[i] = m
	}
	logf("conditions: %d Nodes and publishers (%v)", k, time.Since(t0).Round(time.Millisecond))

	// each runs step on every member, 50 at a time.
	each := func(step func(m *conditionsMember) error) error {
		var wg sync.WaitGroup
		errs := make(chan error, k)
		sem := make(chan struct{}, 50)
		for _, m := range members {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := step(m); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	// serverPatches is the apiserver's count of PATCH nodes/status (any identity: here only the
	// members patch Nodes).
	serverPatches := func() float64 {
		raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return -1
		}
		sum := 0.0
		for _, l := range strings.Split(string(raw), "\n") {
			if !strings.HasPrefix(l, "apiserver_request_total{") {
				continue
			}
			if !strings.Contains(l, `verb="PATCH"`) || !strings.Contains(l, `resource="nodes"`) || !strings.Contains(l, `subresource="status"`) {
				continue
			}
			if v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64); err == nil {
				sum += v
			}
		}
		return sum
	}
	var rows []conditionsRow
	phase := func(name string, hours float64, run func() error) error {
		g0, p0, s0, t0 := gets.Load(), patches.Load(), serverPatches(), time.Now()
		if err := run(); err != nil {
			return fmt.Errorf("conditions %s: %w", name, err)
		}
		r := conditionsRow{phase: name, hours: hours, gets: gets.Load() - g0, patches: patches.Load() - p0,
			serverSide: serverPatches() - s0, took: time.Since(t0)}
		logf("conditions %s: %d GET nodes, %d PATCH nodes/status (apiserver: %.0f) from %d agents in %v",
			name, r.gets, r.patches, r.serverSide, k, r.took.Round(time.Millisecond))
		rows = append(rows, r)
		return nil
	}
	publish := func(m *conditionsMember, r *diagnose.Report) error {
		m.clock = m.clock.Add(agent.DiagnosePeriod)
		return m.nc.Publish(ctx, r)
	}
	day := int(24 * time.Hour / agent.DiagnosePeriod)
	if err := phase("install (first diagnosis)", 0, func() error {
		return each(func(m *conditionsMember) error { return publish(m, fleetReport(diagnose.OK, 40)) })
	}); err != nil {
		return nil, err
	}
	if err := phase("steady, healthy", 24, func() error {
		return each(func(m *conditionsMember) error {
			for range day {
				if err := publish(m, fleetReport(diagnose.OK, 40)); err != nil {
					return err
				}
			}
			return nil
		})
	}); err != nil {
		return nil, err
	}
	fill := func(i int) int { return 91 + i%9 }
	if err := phase("steady, a problem stays (its numbers move every run)", 24, func() error {
		return each(func(m *conditionsMember) error {
			for i := range day {
				if err := publish(m, fleetReport(diagnose.Problem, fill(i))); err != nil {
					return err
				}
			}
			return nil
		})
	}); err != nil {
		return nil, err
	}
	// The restarted agent's first diagnosis finds what its predecessor's last one found, within the
	// same 5 minutes (the rollout restarts it once, not an hour later).
	if err := phase("rollout (every agent restarted once)", 0, func() error {
		return each(func(m *conditionsMember) error {
			if err := newPublisher(m); err != nil {
				return err
			}
			return m.nc.Publish(ctx, fleetReport(diagnose.Problem, fill(day-1)))
		})
	}); err != nil {
		return nil, err
	}
	if err := phase("incident (handled, then a fix fails and recovers)", 0, func() error {
		return each(func(m *conditionsMember) error {
			for _, s := range []diagnose.State{diagnose.Handled, diagnose.Problem, diagnose.Handled} {
				if err := publish(m, fleetReport(s, 95)); err != nil {
					return err
				}
			}
			return nil
		})
	}); err != nil {
		return nil, err
	}
	// Every Node holds one condition per check, and nothing else of ours.
	n, err := admin.CoreV1().Nodes().Get(ctx, members[0].node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ours := 0
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			ours++
		}
	}
	if ours != len(diagnose.ConditionTypes) {
		return nil, fmt.Errorf("conditions: Node %s holds %d of the agent's conditions, want %d", n.Name, ours, len(diagnose.ConditionTypes))
	}
	return rows, nil
}

func renderConditions(k int, rows []conditionsRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nNode conditions: %d agents' publishers (agent.NodeConditions, the agent's ServiceAccount), a diagnosis every %v (simulated time):\n\n", k, agent.DiagnosePeriod)
	b.WriteString("| phase | GET nodes per node | PATCH nodes/status per node | per node per hour | apiserver's PATCH count | wall time |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		rate := "—"
		if r.hours > 0 {
			rate = fmt.Sprintf("%.3f", float64(r.gets+r.patches)/float64(k)/r.hours)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %s | %.0f | %.1f s |\n", r.phase, float64(r.gets)/float64(k), float64(r.patches)/float64(k),
			rate, r.serverSide, r.took.Seconds())
	}
	return b.String()
}
