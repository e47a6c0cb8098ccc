// Command codecounts prints the figures of issue #62 for the checkout it runs in: the agent
// binary's own lines and the fixes' share, the SDK's packages and exported names, the SDK's imports
// of the runtime, the binary's functions over 100 lines, and time.Sleep calls in tests.
//
//	go run ./hack/codecounts
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

const module = "github.com/network-node-manager/network-node-manager"

// maxFuncLines is the length check's limit (internal/codesize).
const maxFuncLines = 100

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Module     *struct{ Path string }
}

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "codecounts:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	bin, err := goList("-deps", "./cmd/network-node-manager")
	if err != nil {
		return err
	}
	sdk, err := goList("./core/...")
	if err != nil {
		return err
	}
	var own, fixes, long int
	var longs []string
	for _, p := range bin {
		if !ours(p.ImportPath) {
			continue
		}
		n, fns, err := lines(p)
		if err != nil {
			return err
		}
		own += n
		if strings.HasPrefix(rel(p.ImportPath), "fixes/") {
			fixes += n
		}
		long += len(fns)
		longs = append(longs, fns...)
	}
	fmt.Fprintf(w, "binary's own lines (go list -deps ./cmd/network-node-manager, this module, non-test): %d\n", own)
	fmt.Fprintf(w, "fixes/* lines: %d (%.1f %%)\n", fixes, 100*float64(fixes)/float64(own))

	var exported, arrows int
	var into []string
	for _, p := range sdk {
		n, err := exportedNames(p)
		if err != nil {
			return err
		}
		exported += n
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/internal/") {
				arrows++
				into = append(into, rel(p.ImportPath)+" -> "+rel(imp))
			}
		}
	}
	fmt.Fprintf(w, "SDK packages (go list ./core/...): %d, exported names: %d\n", len(sdk), exported)
	fmt.Fprintf(w, "SDK imports of internal/ (package -> package): %d\n", arrows)
	for _, a := range into {
		fmt.Fprintf(w, "  %s\n", a)
	}
	fmt.Fprintf(w, "binary functions over %d lines: %d\n", maxFuncLines, long)
	for _, l := range longs {
		fmt.Fprintf(w, "  %s\n", l)
	}
	sleeps, err := testSleeps(".")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "time.Sleep calls in _test.go files (this module and examples/): %d\n", sleeps)
	return nil
}

func ours(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

func goList(args ...string) ([]pkg, error) {
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %v: %w", args, err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].ImportPath < pkgs[j].ImportPath })
	return pkgs, nil
}

// lines counts the package's non-test source lines and names its functions over maxFuncLines.
func lines(p pkg) (int, []string, error) {
	n := 0
	var long []string
	fset := token.NewFileSet()
	for _, f := range p.GoFiles {
		path := filepath.Join(p.Dir, f)
		src, err := os.ReadFile(path)
		if err != nil {
			return 0, nil, err
		}
		n += bytes.Count(src, []byte("\n"))
		file, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return 0, nil, err
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if l := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; l > maxFuncLines {
				long = append(long, fmt.Sprintf("%s/%s: %s %d", rel(p.ImportPath), f, funcName(fn), l))
			}
		}
	}
	return n, long, nil
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}

// exportedNames counts the package's exported top-level names and the exported methods and
// fields of its exported types: what its users can name.
func exportedNames(p pkg) (int, error) {
	fset := token.NewFileSet()
	n := 0
	for _, f := range p.GoFiles {
		file, err := parser.ParseFile(fset, filepath.Join(p.Dir, f), nil, 0)
		if err != nil {
			return 0, err
		}
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d)) {
					n++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							n++
						}
					case *ast.ValueSpec:
						for _, id := range s.Names {
							if id.IsExported() {
								n++
							}
						}
					}
				}
			}
		}
	}
	return n, nil
}

func exportedRecv(fn *ast.FuncDecl) bool {
	name := funcName(fn)
	return ast.IsExported(strings.SplitN(name, ".", 2)[0])
}

// testSleeps counts time.Sleep( in the _test.go files under root.
func testSleeps(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bin" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			n += strings.Count(s.Text(), "time.Sleep(")
		}
		return s.Err()
	})
	return n, err
}
