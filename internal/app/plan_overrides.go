package app

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// planForNode resolves the configuration's nodeOverrides against the labels of the file's Node (the
// one named nodeName, else the file's only Node) as the agent does on that node, gives the engine
// the result and prints which entry applies. Without nodeOverrides it prints nothing.
func planForNode(ctx context.Context, w io.Writer, e *engine.Engine, cfg *config.Config, n *node.Input, hub *watch.Hub) (*config.Config, error) {
	if len(cfg.NodeOverrides()) == 0 {
		return cfg, nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	var labels map[string]string
	switch {
	case hub.NodeName() == "":
		fmt.Fprintf(w, "# nodeOverrides: no node (no nodeName and no one Node in the file): the base configuration\n")
	default:
		if err := n.Start(hub); err != nil {
			return nil, fmt.Errorf("plan: reading the file's Node: %w", err)
		}
		ctx, cancel := context.WithTimeout(ctx, planLoadTimeout)
		defer cancel()
		for n.Synced() != nil {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("plan: reading the file's Node: %w", n.Synced())
			case <-time.After(10 * time.Millisecond):
			}
		}
		if obj := n.Node(); obj != nil {
			labels = obj.Labels
			if labels == nil {
				labels = map[string]string{}
			}
		}
	}
	eff, ov := cfg.ForNode(labels)
	switch {
	case hub.NodeName() == "":
	case labels == nil:
		fmt.Fprintf(w, "# nodeOverrides: node %s is not in the file: the base configuration\n", hub.NodeName())
	case ov.Applies():
		fmt.Fprintf(w, "# nodeOverrides: %s applies on node %s\n", ov, hub.NodeName())
	default:
		fmt.Fprintf(w, "# nodeOverrides: none of %d applies on node %s: the base configuration\n", len(cfg.NodeOverrides()), hub.NodeName())
	}
	if err := e.Configure(eff); err != nil {
		return nil, err
	}
	return eff, nil
}
