// Command network-node-manager is the node agent: `run` keeps the netfilter rules that the enabled
// fixes want, `plan` prints them without touching anything, `cleanup` removes everything the agent
// (and its predecessor) put in the kernel, `version` tells what this binary is.
package main

import (
	"fmt"
	"os"

	"github.com/network-node-manager/network-node-manager/cmd/network-node-manager/app"
	"github.com/network-node-manager/network-node-manager/fixes"
)

// version is set with -ldflags "-X main.version=…" by the Makefile.
var version = "dev"

func main() {
	if err := app.NewCommand(version, fixes.Standard).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
