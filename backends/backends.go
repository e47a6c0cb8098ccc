// Package backends chooses the rule backend the agent runs with and offers both to `plan` and
// `cleanup`.
package backends

import (
	"fmt"
	"log/slog"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/detect"
)

// Names lists the backends in a stable order.
var Names = []string{"iptables", "nftables"}

// Module provides the backend.Backend that detection chose.
var Module = fx.Module("backends", fx.Provide(Selected))

// Selected returns the backend named by the detection result.
func Selected(r detect.Result, log *slog.Logger) (backend.Backend, error) {
	return New(r.Backend, r.IptablesVariant, log)
}

// New returns the named backend. It does no I/O.
func New(name, iptablesVariant string, log *slog.Logger) (backend.Backend, error) {
	switch name {
	case "iptables":
		return iptables.New(iptables.Options{Variant: iptables.Variant(iptablesVariant), Logger: log})
	case "nftables":
		return nftables.New(nftables.Options{Logger: log})
	}
	return nil, fmt.Errorf("unknown backend %q (want iptables or nftables)", name)
}
