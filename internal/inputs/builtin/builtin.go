// Package builtin lists the agent's own input modules: each provides one or more of the tables
// declared in core/inputs. A new input of the agent is a package under internal/inputs and one line
// below (an input outside this repository joins a custom agent with its Module instead); the engine,
// the watch package and fix.Snapshot do not change.
package builtin

import (
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/internal/inputs/endpointslices"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/inputs/pods"
	"github.com/network-node-manager/network-node-manager/internal/inputs/servicecidrs"
	"github.com/network-node-manager/network-node-manager/internal/inputs/services"
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
func All() ([]inputs.Input, error) {
	var in inputs.Group
	app := fx.New(Module, fx.NopLogger, fx.Populate(&in))
	if err := app.Err(); err != nil {
		return nil, err
	}
	return in.Inputs, nil
}
