package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
)

// conditionsTimeout bounds how long a fix's change takes to reach the Node: the agent kicks a
// diagnosis run when a fix's state changes, at most one per 10 s, and its first run is 10 s after
// its start.
const conditionsTimeout = 60 * time.Second

const overlapType = corev1.NodeConditionType("NodePortEphemeralOverlap")

// ourConditions are the Node's conditions of the agent's types.
func ourConditions(t *testing.T, c *cluster, name string) []corev1.NodeCondition {
	t.Helper()
	n, err := c.admin.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.NodeCondition
	for _, cond := range n.Status.Conditions {
		for _, typ := range diagnose.ConditionTypes {
			if cond.Type == typ {
				out = append(out, cond)
			}
		}
	}
	return out
}

func condition(conds []corev1.NodeCondition, typ corev1.NodeConditionType) *corev1.NodeCondition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// waitCondition waits until the Node's condition typ has status and reason, and logs it as
// `kubectl get node -o yaml` shows it.
func waitCondition(t *testing.T, c *cluster, name string, typ corev1.NodeConditionType, status corev1.ConditionStatus, reason string) corev1.NodeCondition {
	t.Helper()
	var got *corev1.NodeCondition
	took := agenttest.Eventually(t, conditionsTimeout, func() error {
		if got = condition(ourConditions(t, c, name), typ); got == nil || got.Status != status || got.Reason != reason {
			return fmt.Errorf("condition %s: %+v, want status %s reason %s", typ, got, status, reason)
		}
		return nil
	})
	y, _ := yaml.Marshal(got)
	t.Logf("after %v, status.conditions[type=%s]:\n%s", took.Round(100*time.Millisecond), typ, y)
	return *got
}

// TestNodeConditions (#61) runs the agent as its ServiceAccount (deploy/base's RBAC) in a node
// namespace whose ephemeral port range (1024-65535) covers the NodePort range, and reads its Node:
//   - the diagnosis is on the Node: NodePortEphemeralOverlap True (NoEnabledFix), one condition
//     per check;
//   - a reload enabling nodeport-reserved-ports: the fix reserves the range, and the condition
//     turns False (HandledByNodeportReservedPorts) without waiting for the 5-minute period;
//   - a reload disabling it: the reservation is reverted, True again;
//   - a restart: the new agent finds the Node as it wants it and patches nothing
//     (nnm_node_condition_patches_total 0), lastTransitionTime unchanged;
//   - `cleanup` with the same identity removes the agent's conditions and nothing else.
func TestNodeConditions(t *testing.T) {
	c := sharedCluster(t, "iptables")
	ctx := t.Context()
	stateDir := t.TempDir()
	var name string
	n := startNode(t, c, "iptables", nodeOptions{setup: func(t *testing.T, ns *netns.NS) {
		ns.MustExec("sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535")
		name = "node-" + ns.Name[len(ns.Name)-8:]
		if err := kubeproxytest.CreateNode(ctx, c.admin, name, "192.0.2.1"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}})
	if n.name != name {
		t.Fatalf("the agent runs as %s, the Node is %s", n.name, name)
	}
	open := waitCondition(t, c, name, overlapType, corev1.ConditionTrue, diagnose.ReasonFixNotEnabled)
	if !strings.Contains(open.Message, "2768 NodePorts (30000-32767) are inside the ephemeral port range 1024-65535") {
		t.Errorf("the message does not name the ports: %q", open.Message)
	}
	all := ourConditions(t, c, name)
	if len(all) != len(diagnose.ConditionTypes) {
		t.Errorf("%d conditions of the agent's types, want one per check (%d)", len(all), len(diagnose.ConditionTypes))
	}
	for _, cond := range all {
		t.Logf("condition %s=%s (%s): %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}

	enabled := defaultConfig + "  nodeport-reserved-ports:\n    enabled: true\n    stateDir: " + stateDir + "\n"
	n.writeConfig(enabled)
	handled := waitCondition(t, c, name, overlapType, corev1.ConditionFalse, "HandledByNodeportReservedPorts")
	if got := strings.TrimSpace(n.ns.MustExec("sysctl", "-n", "net.ipv4.ip_local_reserved_ports")); got != "30000-32767" {
		t.Errorf("ip_local_reserved_ports %q, want 30000-32767", got)
	}
	if !handled.LastTransitionTime.After(open.LastTransitionTime.Time) {
		t.Errorf("lastTransitionTime did not move with the status: %v then %v", open.LastTransitionTime, handled.LastTransitionTime)
	}

	n.writeConfig(defaultConfig)
	waitCondition(t, c, name, overlapType, corev1.ConditionTrue, diagnose.ReasonFixNotEnabled)
	if got := strings.TrimSpace(n.ns.MustExec("sysctl", "-n", "net.ipv4.ip_local_reserved_ports")); got != "" {
		t.Errorf("ip_local_reserved_ports %q after the fix was disabled, want it empty again", got)
	}

	// A restart: the first diagnosis of the new agent finds the Node as it would make it.
	before := ourConditions(t, c, name)
	n.switchBackend("iptables")
	started := time.Now()
	agenttest.Eventually(t, conditionsTimeout, func() error {
		if v, ok := n.metrics().Value("nnm_diagnosis_last_run_timestamp_seconds"); !ok || v < float64(started.Unix()) {
			return fmt.Errorf("no diagnosis since the restart yet")
		}
		return nil
	})
	if v, _ := n.metrics().Value("nnm_node_condition_patches_total", "result", "ok"); v != 0 {
		t.Errorf("the restarted agent patched the Node %v times, want 0", v)
	}
	after := ourConditions(t, c, name)
	for _, b := range before {
		if a := condition(after, b.Type); a == nil || a.Status != b.Status || !a.LastTransitionTime.Equal(&b.LastTransitionTime) {
			t.Errorf("condition %s changed across the restart: %+v -> %+v", b.Type, b, a)
		}
	}

	// cleanup, as the uninstall pods run it (API access, the node's name): the conditions go.
	if err := n.agent.Stop(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := n.ns.Command(bin, "cleanup", "--kubeconfig", n.kubeconfig(t), "--node-name", name).CombinedOutput()
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if left := ourConditions(t, c, name); len(left) != 0 {
		t.Errorf("cleanup left %d conditions: %+v\n%s", len(left), left, out)
	}
	node, err := c.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil || condition(node.Status.Conditions, corev1.NodeReady) == nil {
		t.Errorf("cleanup took the kubelet's Ready condition too (or the Node): %v", err)
	}
}

// kubeconfig is the kubeconfig the node's agent runs with.
func (n *node) kubeconfig(t *testing.T) string {
	t.Helper()
	for i, a := range n.args[:len(n.args)-1] {
		if a == "--kubeconfig" {
			return n.args[i+1]
		}
	}
	t.Fatal("the agent runs without --kubeconfig")
	return ""
}
