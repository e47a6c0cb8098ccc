// Package fixes_test is the central test of the example fixes: every folder here is a fix module,
// checked like the in-tree ones (testkit.FixTree).
package fixes_test

import (
	"testing"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/testkit"

	"example.com/nnm-examples/fixes/metadatablock"
)

func TestFixes(t *testing.T) {
	testkit.FixTree{Dir: ".", Modules: []fx.Option{metadatablock.Module}}.Check(t)
}
