package fixes

import (
	"os"
	"slices"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestStandard builds every in-tree fix through fx with the core's dependencies faked, and checks that
// every fix directory is registered, ids are unique and valid, and metrics do not collide.
func TestStandard(t *testing.T) {
	got, ids := standardFixes(t)

	var fixIDs []string
	for _, f := range got {
		if !rules.ValidFixID(f.ID()) {
			t.Errorf("fix id %q is not kebab-case", f.ID())
		}
		fixIDs = append(fixIDs, f.ID())
	}
	slices.Sort(fixIDs)
	slices.Sort(ids)
	if !slices.Equal(fixIDs, ids) || len(slices.Compact(slices.Clone(fixIDs))) != len(fixIDs) {
		t.Errorf("fixes %v and registered ids %v differ or repeat", fixIDs, ids)
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
	if dirs != len(got) {
		t.Errorf("%d fix directories but %d fixes registered in Standard", dirs, len(got))
	}
}
