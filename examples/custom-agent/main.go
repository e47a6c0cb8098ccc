// Command custom-agent is network-node-manager with one more fix: the standard fixes plus the
// example metadata-block fix, built from a module of its own. It has the same commands (run, plan,
// cleanup, version), configuration, metrics and deployment as the stock agent.
//
//	go build -o custom-agent ./custom-agent
//	./custom-agent version
//	./custom-agent plan --services ../services.yaml --config custom-agent/config.yaml
package main

import (
	"fmt"
	"os"

	"go.uber.org/fx"

	"example.com/nnm-examples/fixes/metadatablock"
	"example.com/nnm-examples/inputs/namespacelabels"

	"github.com/network-node-manager/network-node-manager/app"
	"github.com/network-node-manager/network-node-manager/fixes"
)

// version is set with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if err := app.NewCommand(version, fx.Options(fixes.Standard, metadatablock.Module, namespacelabels.Module)).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
