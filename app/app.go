// Package app is the front door for building an agent: the standard fixes plus one's own, with the
// stock agent's commands (run, plan, cleanup, diagnose, version), configuration, metrics and
// manifests. It is a thin public face of the runtime (internal/app) and not part of the SDK: a fix
// or an input imports core/… only; a custom agent's main.go imports this package too.
//
//	app.NewCommand(version, fx.Options(fixes.Standard, myfix.Module)).Execute()
package app

import (
	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/internal/app"
)

// Build identifies the binary: its version and the commit it was built from.
type Build = app.Build

// NewCommand returns the agent's root command around the fix (and input) modules given.
func NewCommand(version string, modules fx.Option) *cobra.Command {
	return app.NewCommand(version, modules)
}

// New is NewCommand with the commit too, for `version`.
func New(b Build, modules fx.Option) *cobra.Command { return app.New(b, modules) }

// ExitCode is the process exit status for an error Execute returned.
func ExitCode(err error) int { return app.ExitCode(err) }
