package codesize

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/network-node-manager/network-node-manager/"

// sdk is the public surface a fix author or a custom-agent author imports; the runtime lives under
// internal/ (docs/development.md, Repository layout).
var sdk = []string{"core/", "fixes", "backends"}

// TestSDKBoundary: a fix module's code (fixes/, and examples/, the out-of-tree fix and custom agent)
// imports only the public SDK. Its tests may use the module's test harness under internal/.
func TestSDKBoundary(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range []string{"fixes", "examples"} {
		root := filepath.Join("..", "..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			checked++
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				rest, ours := strings.CutPrefix(p, module)
				if !ours {
					continue
				}
				public := false
				for _, s := range sdk {
					public = public || strings.HasPrefix(rest, s)
				}
				if !public {
					t.Errorf("%s imports %s, which is not part of the SDK (%v)", path, p, sdk)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d files: the walk did not find the fixes", checked)
	}
}
