package fixes

import (
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// standardFixes builds a fresh set of the in-tree fixes through fx with the core's dependencies
// faked, and returns them with the registered ids.
func standardFixes(t testing.TB) ([]fix.Fix, []string) {
	t.Helper()
	var got fix.In
	var ids fix.IDs
	app := fxtest.New(t, Standard, testkit.Fakes(), fx.Populate(&got, &ids))
	app.RequireStart().RequireStop()
	return got.Fixes, ids.IDs
}

// TestIncrementalEqualsScratch: every in-tree rule fix that reads Services computes, after any
// sequence of Service events, exactly what a fresh instance computes from the same snapshot (the
// fixes keep per-Service results between syncs; see fix.ServiceMap).
func TestIncrementalEqualsScratch(t *testing.T) {
	tested := 0
	all, _ := standardFixes(t)
	for _, f := range all {
		if _, ok := f.(fix.RuleFix); !ok || !strings.Contains(testkit.Reads(f), "Services") {
			continue
		}
		tested++
		id := f.ID()
		t.Run(id, func(t *testing.T) {
			testkit.CheckIncremental(t, func() fix.RuleFix {
				fresh, _ := standardFixes(t)
				for _, g := range fresh {
					if g.ID() == id {
						return g.(fix.RuleFix)
					}
				}
				t.Fatalf("fix %s vanished", id)
				return nil
			}, testkit.IncrementalOptions{Seeds: 4, Steps: 60})
		})
	}
	if tested == 0 {
		t.Fatal("no in-tree rule fix reads Services: nothing was tested")
	}
}
