package agent

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Overrides keeps the engine on the configuration in effect on this node (NodeOverrides). `run`
// adds it; it is a module of its own so that its start hook, which picks the entry for this node's
// labels, runs before the engine starts.
var Overrides = fx.Module("node-overrides",
	fx.Provide(NewNodeOverrides),
	fx.Invoke(func(lc fx.Lifecycle, o *NodeOverrides) { lc.Append(fx.Hook{OnStart: o.start}) }),
)

// nodeWait bounds how long the agent waits at start for this node's Node, whose labels choose the
// entry of nodeOverrides; after it the base configuration applies until the Node arrives.
const nodeWait = 10 * time.Second

// NodeOverrides hands the engine the configuration in effect on this node: the loaded (base)
// configuration with the first entry of its nodeOverrides that selects this node's Node by its
// labels (config.Config.ForNode). It re-resolves when the Node's labels change and when a reloaded
// file changes the base; either way the engine takes the result through Reconfigure, the one path of
// a reload, so a fix whose settings change is reconfigured, removed or added as on a reload, and a
// result a fix refuses is rejected and the running configuration stays. At start it waits (at most
// nodeWait) for the Node, so that a restart does not flap a fix its entry enables.
type NodeOverrides struct {
	node        *node.Input
	hub         *watch.Hub
	m           *metrics.Sync
	log         *slog.Logger
	configure   func(*config.Config) error // before the engine starts
	reconfigure func(*config.Config)       // after

	mu       sync.Mutex
	base     *config.Config
	labels   map[string]string // nil while the Node is unknown
	applied  config.Override
	watching bool
	started  bool
}

// NewNodeOverrides returns the resolver of the configuration cfg (the loaded one) for engine e; it
// does no I/O.
func NewNodeOverrides(cfg *config.Config, n *node.Input, hub *watch.Hub, e *engine.Engine, m *metrics.Sync, log *slog.Logger) *NodeOverrides {
	return &NodeOverrides{node: n, hub: hub, m: m, log: log, configure: e.Configure, reconfigure: e.Reconfigure,
		base: cfg.Base(), applied: config.None}
}

func (o *NodeOverrides) start(ctx context.Context) error {
	o.node.OnChange(o.nodeChanged)
	o.mu.Lock()
	base := o.base
	o.mu.Unlock()
	if len(base.NodeOverrides()) > 0 && o.watch() {
		o.waitNode(ctx)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	eff, ov := o.base.ForNode(o.labels)
	if err := o.configure(eff); err != nil {
		return err
	}
	o.started = true
	o.report(ov, true)
	return nil
}

// watch starts the Node's informer (once); false when it cannot run.
func (o *NodeOverrides) watch() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.watching {
		return true
	}
	if o.hub.NodeName() == "" {
		o.log.Warn("config: nodeOverrides need this node's name (nodeName / NNM_NODE_NAME) to read its labels; the base configuration applies")
		return false
	}
	if err := o.node.Start(o.hub); err != nil {
		o.log.Warn("config: cannot watch this node's Node for nodeOverrides; the base configuration applies", "node", o.hub.NodeName(), "err", err)
		return false
	}
	o.watching = true
	return true
}

// waitNode waits until the Node was listed (at most nodeWait) and takes its labels.
func (o *NodeOverrides) waitNode(ctx context.Context) {
	deadline := time.NewTimer(nodeWait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for o.node.Synced() != nil {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			o.log.Warn("config: this node's Node is not listed yet; the base configuration applies until it is, then its nodeOverrides entry", "node", o.hub.NodeName(), "waited", nodeWait)
			return
		case <-tick.C:
		}
	}
	n := o.node.Node()
	o.mu.Lock()
	defer o.mu.Unlock()
	if n == nil {
		o.log.Warn("config: no Node named like this node; the base configuration applies until there is one", "node", o.hub.NodeName())
		return
	}
	o.labels = nodeLabels(n)
}

// nodeLabels are n's labels, an empty set (not nil: a selector such as {} or DoesNotExist selects
// it) for a Node without labels.
func nodeLabels(n *corev1.Node) map[string]string {
	if n.Labels == nil {
		return map[string]string{}
	}
	return n.Labels
}

// nodeChanged re-resolves when the Node's labels select another entry. A deleted Node keeps the
// entry of its last labels: what runs on the node does not change because its object is gone.
func (o *NodeOverrides) nodeChanged(n *corev1.Node) {
	if n == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.labels = nodeLabels(n)
	if !o.started {
		return // start resolves
	}
	if ov := o.base.ResolveOverride(o.labels); ov != o.applied {
		eff, ov := o.base.ForNode(o.labels)
		o.reconfigure(eff)
		o.report(ov, false)
	}
}

// Apply takes a reloaded configuration (the base) and hands the engine its result for this node.
func (o *NodeOverrides) Apply(cfg *config.Config) {
	if len(cfg.NodeOverrides()) > 0 {
		o.watch() // a reload may add the first entry; the Node's labels then arrive by nodeChanged
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.base = cfg.Base()
	eff, ov := o.base.ForNode(o.labels)
	o.reconfigure(eff)
	o.report(ov, ov != o.applied)
}

// report logs which entry applies (when told to) and exports it as nnm_config_node_override. Call
// with o.mu held.
func (o *NodeOverrides) report(ov config.Override, logIt bool) {
	o.applied = ov
	o.m.NodeOverride.Reset()
	label := "none"
	if ov.Applies() {
		label = strconv.Itoa(ov.Index)
	}
	o.m.NodeOverride.WithLabelValues(label).Set(1)
	if !logIt || len(o.base.NodeOverrides()) == 0 && !ov.Applies() {
		return
	}
	entries := len(o.base.NodeOverrides())
	switch {
	case ov.Applies():
		o.log.Info("config: "+ov.String()+" applies on node "+o.hub.NodeName(), "override", ov.Index, "selector", ov.Selector, "node", o.hub.NodeName(), "labelsKnown", o.labels != nil)
	case o.labels == nil:
		o.log.Info("config: no override applies: this node's labels are not known; the base configuration", "node", o.hub.NodeName(), "nodeOverrides", entries)
	default:
		o.log.Info("config: no override applies on node "+o.hub.NodeName()+"; the base configuration", "node", o.hub.NodeName(), "nodeOverrides", entries)
	}
}

// Effective is the configuration in effect on this node now and the nodeOverrides entry it applies
// (for diagnose's metrics in the running agent).
func (o *NodeOverrides) Effective() (*config.Config, config.Override) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.base.ForNode(o.labels)
}
