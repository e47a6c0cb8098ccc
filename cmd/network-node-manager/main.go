// Command network-node-manager is the node agent: `run` keeps the netfilter rules that the enabled
// fixes want, `plan` prints them without touching anything, `cleanup` removes everything the agent
// (and its predecessor) put in the kernel, `version` tells what this binary is.
package main

import (
	"fmt"
	"os"

	"github.com/network-node-manager/network-node-manager/app"
	"github.com/network-node-manager/network-node-manager/fixes"
)

// version and commit are set with -ldflags "-X main.version=… -X main.commit=…" by the Makefile
// (hack/version.sh), hack/image.sh and the Dockerfile.
var (
	version = "dev"
	commit  = ""
)

func main() {
	if err := app.New(app.Build{Version: version, Commit: commit}, fixes.Standard).Execute(); err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "error:", msg)
		}
		os.Exit(app.ExitCode(err))
	}
}
