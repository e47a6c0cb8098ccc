// Package codesize holds checks on the shape of the code that review alone lets slip.
package codesize

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// MaxFuncLines is the longest a function (tests included) may be in the packages that hold the
// reconcile logic (issue #21): past it, a function mixes steps that deserve names of their own.
const MaxFuncLines = 100

// TestNoLongFunctions: no function in backends/, core/backend or internal/engine is longer than
// MaxFuncLines, from its signature to its closing brace.
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	for _, dir := range []string{"backends", "core/backend", "internal/engine"} {
		root := filepath.Join("..", "..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
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
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
