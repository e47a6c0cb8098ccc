package fixes

import (
	"os"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/sysctl"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// TestStandard builds every in-tree fix through fx with the core's dependencies faked, and checks that
// every fix directory is registered, ids are unique and valid, and metrics do not collide.
func TestStandard(t *testing.T) {
	var got fix.In
	var ids fix.IDs
	app := fxtest.New(t, Standard,
		fx.Provide(
			func() backend.Backend { return testkit.NewFakeBackend() },
			func() sysctl.Interface { return sysctl.NewFake(nil) },
			prometheus.NewRegistry,
		),
		fx.Populate(&got, &ids),
	)
	app.RequireStart().RequireStop()

	var fixIDs []string
	for _, f := range got.Fixes {
		if !rules.ValidFixID(f.ID()) {
			t.Errorf("fix id %q is not kebab-case", f.ID())
		}
		fixIDs = append(fixIDs, f.ID())
	}
	slices.Sort(fixIDs)
	slices.Sort(ids.IDs)
	if !slices.Equal(fixIDs, ids.IDs) || len(slices.Compact(slices.Clone(fixIDs))) != len(fixIDs) {
		t.Errorf("fixes %v and registered ids %v differ or repeat", fixIDs, ids.IDs)
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	dirs := 0
	for _, e := range entries {
		if e.IsDir() {
			dirs++
		}
	}
	if dirs != len(got.Fixes) {
		t.Errorf("%d fix directories but %d fixes registered in Standard", dirs, len(got.Fixes))
	}
}
