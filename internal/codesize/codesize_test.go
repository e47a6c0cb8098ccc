// Package codesize holds checks on the shape of the code that review alone lets slip.
package codesize

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// MaxFuncLines is the longest a function may be in the agent's binary (issue #21, issue #62):
// past it, a function mixes steps that deserve names of their own.
const MaxFuncLines = 100

// reconcileDirs are where the check covers tests too: the packages that hold the reconcile logic.
var reconcileDirs = []string{"backends", "core/backend", "internal/engine"}

// TestNoLongFunctions: no function of a non-test file of a package the binary links
// (go list -deps ./cmd/network-node-manager), and no function of a test of the reconcile
// packages, is longer than MaxFuncLines, from its signature to its closing brace.
func TestNoLongFunctions(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{if .Module}}{{if eq .Module.Path "`+strings.TrimSuffix(module, "/")+`"}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{end}}{{end}}`,
		"../../cmd/network-node-manager").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	files := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		for _, f := range fields[1:] {
			checkFile(t, fset, filepath.Join(fields[0], f))
			files++
		}
	}
	if files < 100 {
		t.Fatalf("checked %d files of the binary: go list did not find its packages", files)
	}
	for _, dir := range reconcileDirs {
		err := filepath.WalkDir(filepath.Join("..", "..", dir), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, "_test.go") {
				checkFile(t, fset, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func checkFile(t *testing.T, fset *token.FileSet, path string) {
	t.Helper()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok {
			continue
		}
		if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > MaxFuncLines {
			t.Errorf("%s: %s is %d lines long (at most %d)", path, fn.Name.Name, n, MaxFuncLines)
		}
	}
}
