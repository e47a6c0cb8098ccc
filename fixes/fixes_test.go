package fixes

import (
	"slices"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// TestStandard builds every in-tree fix together through fx with the core's dependencies faked, and
// checks that ids are unique and valid and metrics do not collide.
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
}

// TestFixes is the central test of every fix folder: files, README sections and example, option
// decoding, metric names and documentation, promlint (testkit.FixTree). A new fix added to Modules is
// checked without writing a line; a folder missing from Modules fails.
func TestFixes(t *testing.T) {
	testkit.FixTree{Dir: ".", Modules: Modules}.Check(t)
}
