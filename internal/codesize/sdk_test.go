package codesize

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/network-node-manager/network-node-manager/"

// MaxSDKPackages bounds the SDK: the importable packages under core/ that a fix or an input
// author needs (issue #62).
const MaxSDKPackages = 8

// public is what a fix module's code (fixes/, examples/) may import of this module: the SDK
// (core/), the standard fixes (a custom agent's fixes.Standard) and the front door that builds an
// agent (app, which imports the runtime and is not part of the SDK).
var public = []string{"core/", "fixes", "app"}

// TestSDKBoundary: a fix module's code (fixes/, and examples/: the out-of-tree fix and input and
// the custom agent) imports only the public packages. Its tests may use the module's test
// harnesses under internal/testing.
func TestSDKBoundary(t *testing.T) {
	checked := walkImports(t, []string{"fixes", "examples"}, func(path, imp string) {
		for _, s := range public {
			if imp == s || strings.HasPrefix(imp, strings.TrimSuffix(s, "/")+"/") {
				return
			}
		}
		t.Errorf("%s imports %s, which is not public (%v)", path, imp, public)
	})
	if checked < 10 {
		t.Fatalf("checked %d files: the walk did not find the fixes", checked)
	}
}

// TestSDKIsALayer: the SDK imports nothing of the runtime (internal/), so that a fix or an input
// written against it can live outside this repository, and it stays at most MaxSDKPackages
// packages.
func TestSDKIsALayer(t *testing.T) {
	walkImports(t, []string{"core"}, func(path, imp string) {
		if strings.HasPrefix(imp, "internal/") {
			t.Errorf("%s imports the runtime's %s: the SDK must stand on its own", path, imp)
		}
	})
	pkgs := map[string]bool{}
	err := filepath.WalkDir(filepath.Join("..", "..", "core"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			pkgs[filepath.Dir(path)] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) > MaxSDKPackages || len(pkgs) < 4 {
		t.Errorf("core/ has %d packages, want at most %d: %v", len(pkgs), MaxSDKPackages, pkgs)
	}
}

// walkImports calls check for every import of this module in the non-test Go files under dirs
// (relative to the module root), with the import path relative to the module; it returns the
// number of files read.
func walkImports(t *testing.T, dirs []string, check func(path, imp string)) int {
	t.Helper()
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range dirs {
		root := filepath.Join("..", "..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				if d != nil && d.IsDir() && d.Name() == "testdata" {
					return fs.SkipDir
				}
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			checked++
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if rest, ours := strings.CutPrefix(p, module); ours {
					check(path, rest)
				}
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	return checked
}
