// Package backends chooses the rule backend the agent runs with and offers both to `plan` and
// `cleanup`.
package backends

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/detect"
)

// Names lists the backends in a stable order.
var Names = backend.Names

// Module provides the backend.Backend that detection chose.
var Module = fx.Module("backends", fx.Provide(Selected))

// Selected returns the backend named by the detection result.
func Selected(r detect.Result, log *slog.Logger) (backend.Backend, error) {
	return New(r.Backend, r.IptablesVariant, log)
}

// Leftovers is what `run` removes once its own rules are in (agent.CleanPredecessor, fix by fix):
// what the backend it does not run holds of a fix (all of it for fix ""), in both families. With the
// iptables backend that is the nnm-* nftables tables; with the nftables backend the NNM- chains of
// the node's iptables variant (the predecessor's NMANAGER_ chains stay for `cleanup`, as with
// nftables they always did). `cleanup` removes both backends' objects regardless.
func Leftovers(r detect.Result, log *slog.Logger) (agent.Leftovers, error) {
	switch r.Backend {
	case backend.IPTables:
		other, err := nftables.NewOps(nftables.Options{Logger: log})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, fix string) (int, error) {
			if fix == "" {
				return other.RemoveAll(ctx)
			}
			return other.RemoveFix(ctx, fix)
		}, nil
	case backend.NFTables:
		other, err := iptables.NewOps(iptables.Options{Variant: iptables.Variant(r.IptablesVariant), Logger: log})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, fix string) (int, error) {
			total := 0
			var errs []error
			for _, f := range rules.Families {
				remove := func() (int, error) { return other.RemoveFix(ctx, f, fix) }
				if fix == "" {
					remove = func() (int, error) { return other.RemoveAll(ctx, f) }
				}
				n, err := remove()
				total += n
				errs = append(errs, err)
			}
			return total, errors.Join(errs...)
		}, nil
	}
	return nil, fmt.Errorf("unknown backend %q (want iptables or nftables)", r.Backend)
}

// Takeover provides Leftovers to the graph of `run` (agent.CleanPredecessor calls it), and the
// BackendFactory with which the agent switches backends while it runs (agent.Follow).
var Takeover = fx.Provide(Leftovers, Factory)

// Factory builds the backends of a switch while the agent runs: the named backend and the Leftovers
// of the other one.
func Factory(log *slog.Logger) agent.BackendFactory {
	return func(name, variant string) (backend.Backend, agent.Leftovers, error) {
		be, err := New(name, variant, log)
		if err != nil {
			return nil, nil, err
		}
		lo, err := Leftovers(detect.Result{Backend: name, IptablesVariant: variant}, log)
		if err != nil {
			return nil, nil, err
		}
		return be, lo, nil
	}
}

// New returns the named backend. It does no I/O.
func New(name, iptablesVariant string, log *slog.Logger) (backend.Backend, error) {
	switch name {
	case backend.IPTables:
		return iptables.New(iptables.Options{Variant: iptables.Variant(iptablesVariant), Logger: log})
	case backend.NFTables:
		return nftables.New(nftables.Options{Logger: log})
	}
	return nil, fmt.Errorf("unknown backend %q (want iptables or nftables)", name)
}
