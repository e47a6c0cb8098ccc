package agent

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
)

func report(states map[string]diagnose.State) *diagnose.Report {
	r := &diagnose.Report{}
	for _, check := range diagnose.CheckIDs() {
		f := diagnose.Finding{Check: check, State: diagnose.OK, Summary: "fine"}
		if s, ok := states[check]; ok {
			f.State, f.Summary = s, check+" is "+string(s)
		}
		if f.State == diagnose.Handled {
			f.HandledBy = "nodeport-reserved-ports"
		}
		r.Findings = append(r.Findings, f)
	}
	return r
}

// The publisher patches only what changed, keeps lastTransitionTime while a status stays, patches a
// message-only change at most once per MessageRefresh, starts from the Node (a restart patches
// nothing), and Remove takes its conditions and no other.
func TestNodeConditionsPatchOnChange(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clock := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	mk := func() (*NodeConditions, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		nc, err := NewNodeConditions(kubetest.From(cs), "n1", reg, log)
		if err != nil {
			t.Fatal(err)
		}
		nc.now = func() time.Time { return clock }
		return nc, reg
	}
	nc, reg := mk()
	patches := func(reg *prometheus.Registry) float64 {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "nnm_node_condition_patches_total" && m.GetLabel()[0].GetValue() == "ok" {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	get := func(typ corev1.NodeConditionType) corev1.NodeCondition {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		t.Fatalf("no condition %s in %+v", typ, n.Status.Conditions)
		return corev1.NodeCondition{}
	}
	ctx := context.Background()
	publish := func(r *diagnose.Report) {
		t.Helper()
		if err := nc.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	publish(report(map[string]diagnose.State{"nodeport-ephemeral": diagnose.Problem}))
	c := get("NodePortEphemeralOverlap")
	if c.Status != corev1.ConditionTrue || c.Reason != diagnose.ReasonFixNotEnabled || c.Message != "nodeport-ephemeral is problem" || !c.LastTransitionTime.Time.Equal(clock) {
		t.Errorf("first publish: %+v", c)
	}
	if get(corev1.NodeReady).Reason != "KubeletReady" || patches(reg) != 1 {
		t.Errorf("the kubelet's condition changed, or %v patches", patches(reg))
	}
	clock = clock.Add(5 * time.Minute)
	publish(report(map[string]diagnose.State{"nodeport-ephemeral": diagnose.Problem}))
	if patches(reg) != 1 {
		t.Errorf("an unchanged report patched: %v patches", patches(reg))
	}
	// A new message alone waits for MessageRefresh.
	r := report(map[string]diagnose.State{"nodeport-ephemeral": diagnose.Problem})
	r.Find("nodeport-ephemeral").Summary = "nodeport-ephemeral has new numbers"
	publish(r)
	if patches(reg) != 1 {
		t.Errorf("a message-only change patched before MessageRefresh")
	}
	clock = clock.Add(MessageRefresh)
	publish(r)
	if c := get("NodePortEphemeralOverlap"); patches(reg) != 2 || c.Message != "nodeport-ephemeral has new numbers" || c.LastTransitionTime.Time.Equal(clock) {
		t.Errorf("after MessageRefresh: %v patches, %+v", patches(reg), c)
	}
	// Handled: the status changes, so does the transition time.
	clock = clock.Add(time.Minute)
	publish(report(map[string]diagnose.State{"nodeport-ephemeral": diagnose.Handled}))
	if c := get("NodePortEphemeralOverlap"); c.Status != corev1.ConditionFalse || c.Reason != "HandledByNodeportReservedPorts" || !c.LastTransitionTime.Time.Equal(clock) {
		t.Errorf("handled: %+v", c)
	}
	// A restarted agent with the same findings patches nothing.
	nc, reg = mk()
	publish(report(map[string]diagnose.State{"nodeport-ephemeral": diagnose.Handled}))
	if patches(reg) != 0 {
		t.Errorf("a restarted agent patched %v times", patches(reg))
	}
	n, err := nc.Remove(ctx)
	if err != nil || n != len(diagnose.ConditionTypes) {
		t.Fatalf("Remove: %d %v", n, err)
	}
	node, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if len(node.Status.Conditions) != 1 || node.Status.Conditions[0].Type != corev1.NodeReady {
		t.Errorf("after Remove: %+v", node.Status.Conditions)
	}
}
