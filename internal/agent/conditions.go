package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// MessageRefresh is how often at most a condition whose status and reason stay is patched for a
// new message (counts in a summary move on every run): a status or reason change is patched at
// once.
const MessageRefresh = time.Hour

// NodeConditions publishes the diagnosis as conditions of this node's Node (diagnose.Conditions),
// node-problem-detector's way: one strategic-merge patch of the status subresource, only when a
// condition changes. It starts from the Node as the API server has it (one get, again after a
// failed patch), so a restarted agent patches nothing that is already there; lastTransitionTime
// moves only when a status does.
type NodeConditions struct {
	client kube.Interface
	node   string
	log    *slog.Logger
	now    func() time.Time

	mu     sync.Mutex
	known  map[corev1.NodeConditionType]corev1.NodeCondition // ours, as the API server last had them
	loaded bool

	patches *prometheus.CounterVec
}

// NewNodeConditions returns the publisher for node through client; it registers
// nnm_node_condition_patches_total on reg. No I/O.
func NewNodeConditions(client kube.Interface, node string, reg prometheus.Registerer, log *slog.Logger) (*NodeConditions, error) {
	c := &NodeConditions{client: client, node: node, log: log, now: time.Now,
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Name: "node_condition_patches_total",
			Help: "Patches of this node's Node conditions (the diagnosis), by result (ok, error)."}, []string{"result"})}
	for _, r := range []string{"ok", "error"} {
		c.patches.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(c.patches); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// SetClock replaces the publisher's clock (the fleet benchmark simulates days of diagnoses).
func (c *NodeConditions) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}

// Publish makes the Node's conditions r's, patching those that changed.
func (c *NodeConditions) Publish(ctx context.Context, r *diagnose.Report) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		n, err := c.client.GetNode(ctx, c.node)
		if err != nil {
			return fmt.Errorf("node conditions: get Node %s: %w", c.node, err)
		}
		c.take(n)
	}
	now := metav1.NewTime(c.now().Truncate(time.Second))
	var changed []corev1.NodeCondition
	var what []string
	for _, want := range diagnose.Conditions(r) {
		had, ok := c.known[want.Type]
		switch {
		case !ok || had.Status != want.Status:
			want.LastTransitionTime = now
		case had.Reason != want.Reason:
			want.LastTransitionTime = had.LastTransitionTime
		case had.Message != want.Message && now.Sub(had.LastHeartbeatTime.Time) >= MessageRefresh:
			want.LastTransitionTime = had.LastTransitionTime
		default:
			continue
		}
		want.LastHeartbeatTime = now
		changed = append(changed, want)
		what = append(what, fmt.Sprintf("%s=%s (%s)", want.Type, want.Status, want.Reason))
	}
	if len(changed) == 0 {
		return nil
	}
	n, err := c.patch(ctx, changed)
	if err != nil {
		c.loaded = false // read the Node again before the next patch
		return err
	}
	c.take(n)
	c.log.Info("node conditions patched", "node", c.node, "conditions", what)
	return nil
}

// Remove deletes the agent's condition types from the Node (`cleanup`); a Node without them, or
// gone, is no error.
func (c *NodeConditions) Remove(ctx context.Context) (removed int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.client.GetNode(ctx, c.node)
	if err != nil {
		return 0, fmt.Errorf("node conditions: get Node %s: %w", c.node, err)
	}
	var del []map[string]any
	for _, cond := range n.Status.Conditions {
		if ours(cond.Type) {
			del = append(del, map[string]any{"type": cond.Type, "$patch": "delete"})
		}
	}
	if len(del) == 0 {
		return 0, nil
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": del}})
	if err != nil {
		return 0, err
	}
	if _, err := c.client.PatchNodeStatus(ctx, c.node, types.StrategicMergePatchType, body); err != nil {
		c.patches.WithLabelValues("error").Inc()
		return 0, fmt.Errorf("node conditions: remove from Node %s: %w", c.node, err)
	}
	c.patches.WithLabelValues("ok").Inc()
	c.known, c.loaded = nil, false
	return len(del), nil
}

func (c *NodeConditions) patch(ctx context.Context, conds []corev1.NodeCondition) (*corev1.Node, error) {
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds}})
	if err != nil {
		return nil, err
	}
	n, err := c.client.PatchNodeStatus(ctx, c.node, types.StrategicMergePatchType, body)
	if err != nil {
		c.patches.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("node conditions: patch Node %s: %w", c.node, err)
	}
	c.patches.WithLabelValues("ok").Inc()
	return n, nil
}

// take remembers the Node's conditions of the agent's types.
func (c *NodeConditions) take(n *corev1.Node) {
	c.known = map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, cond := range n.Status.Conditions {
		if ours(cond.Type) {
			c.known[cond.Type] = cond
		}
	}
	c.loaded = true
}

func ours(t corev1.NodeConditionType) bool {
	for _, v := range diagnose.ConditionTypes {
		if v == t {
			return true
		}
	}
	return false
}

// NodeConditionsFor is the publisher of `run`: nil (no conditions, logged once) without an API
// client or a node name.
func NodeConditionsFor(cfg *config.Config, api *APIClient, reg prometheus.Registerer, log *slog.Logger) (*NodeConditions, error) {
	client, err := api.Get()
	if err != nil {
		log.Info("no conditions on the Node: no API client", "err", err)
		return nil, nil
	}
	if cfg.NodeName == "" {
		log.Info("no conditions on the Node: no node name (nodeName / NNM_NODE_NAME)")
		return nil, nil
	}
	return NewNodeConditions(client, cfg.NodeName, reg, log)
}
