package testkit

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the one -update flag of every test binary that imports testkit. Packages that import
// testkit must not define their own "update" flag (the flag package panics on redefinition); use
// Updating instead.
var update = flag.Bool("update", false, "rewrite golden files under testdata/ with the current output")

// Updating reports whether the test binary runs with -update.
func Updating() bool { return *update }

// Golden compares got with the file at path (relative to the test's package directory). With -update
// it writes got to path instead (creating directories) and passes. A missing file is an error that
// says how to create it.
func Golden(t testing.TB, path string, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatalf("golden %s: %v", path, err)
			return
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatalf("golden %s: %v", path, err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden %s: %v (run `go test -update` to create it)", path, err)
		return
	}
	if string(want) == got {
		return
	}
	// Line by line: golden files are line-oriented dumps.
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("output differs from golden file %s (-want +got; run `go test -update` to accept):\n%s", path, diff)
	}
}
