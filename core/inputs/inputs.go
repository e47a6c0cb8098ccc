// Package inputs lists the agent's input modules: each provides one or more tables (fix.Table)
// that fixes read. A new input is a package here and one line below; the engine, the watch
// package and fix.Snapshot do not change.
package inputs

import (
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/inputs/endpointslices"
	"github.com/network-node-manager/network-node-manager/core/inputs/node"
	"github.com/network-node-manager/network-node-manager/core/inputs/pods"
	"github.com/network-node-manager/network-node-manager/core/inputs/servicecidrs"
	"github.com/network-node-manager/network-node-manager/core/inputs/services"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Module provides every input.
var Module = fx.Options(
	services.Module,
	node.Module,
	pods.Module,
	servicecidrs.Module,
	endpointslices.Module,
)

// All builds every input of Module outside an agent's graph (tests, tools).
func All() ([]watch.Input, error) {
	var in watch.Inputs
	app := fx.New(Module, fx.NopLogger, fx.Populate(&in))
	if err := app.Err(); err != nil {
		return nil, err
	}
	return in.Inputs, nil
}
