// Command manifests renders and checks deploy/ (package hack/manifests):
//
//	manifests chart [-check]                 write deploy/helm/network-node-manager from deploy/
//	                                         (make helm-chart); -check: fail if it differs
//	manifests render DIR                     kubectl kustomize DIR
//	manifests release ROOT BASE TAG DIGEST   ROOT/deploy/BASE (base, uninstall) with the image at
//	                                         network-node-manager:TAG@DIGEST (make release)
//	manifests diff A.yaml B.yaml             compare two object sets; exit 1 naming each difference
//
// Run from the repository root (go run ./hack/manifests/cmd/manifests ...).
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/network-node-manager/network-node-manager/hack/manifests"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: manifests chart [-check] | render DIR | release ROOT BASE TAG DIGEST | diff A B")
	}
	switch args[0] {
	case "chart":
		return chart(len(args) > 1 && args[1] == "-check")
	case "render":
		if len(args) != 2 {
			return errors.New("usage: manifests render DIR")
		}
		objs, err := manifests.Render(args[1])
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(manifests.Marshal(objs))
		return err
	case "release":
		if len(args) != 5 {
			return errors.New("usage: manifests release ROOT BASE TAG DIGEST")
		}
		objs, err := manifests.RenderWith(args[1], args[2], nil, &manifests.Image{Name: "network-node-manager", NewTag: args[3], Digest: args[4]})
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(manifests.Marshal(objs))
		return err
	case "diff":
		if len(args) != 3 {
			return errors.New("usage: manifests diff A B")
		}
		var sets [2][]manifests.Object
		for i, f := range args[1:] {
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			if sets[i], err = manifests.Parse(data); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
		if d := manifests.Diff(sets[0], sets[1]); len(d) > 0 {
			return fmt.Errorf("%s and %s differ:\n%s", args[1], args[2], strings.Join(d, "\n"))
		}
		fmt.Printf("%s and %s: the same %d objects\n", args[1], args[2], len(sets[0]))
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}

func chart(check bool) error {
	latest, err := exec.Command("hack/version.sh", "--latest").Output()
	if err != nil {
		return fmt.Errorf("hack/version.sh --latest: %w", err)
	}
	files, err := manifests.Chart(".", strings.TrimSpace(string(latest)))
	if err != nil {
		return err
	}
	have := map[string][]byte{}
	err = filepath.WalkDir(manifests.ChartDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(manifests.ChartDir, p)
		have[filepath.ToSlash(rel)] = data
		return nil
	})
	if err != nil {
		return err
	}
	var stale []string
	for name, data := range files {
		if !bytes.Equal(have[name], data) {
			stale = append(stale, name)
		}
	}
	for name := range have {
		if _, ok := files[name]; !ok {
			stale = append(stale, name+" (not generated)")
		}
	}
	sort.Strings(stale)
	if check {
		if len(stale) > 0 {
			return fmt.Errorf("%s is not what deploy/ generates (run make helm-chart): %s", manifests.ChartDir, strings.Join(stale, ", "))
		}
		return nil
	}
	for name := range have {
		if _, ok := files[name]; !ok {
			if err := os.Remove(filepath.Join(manifests.ChartDir, name)); err != nil {
				return err
			}
		}
	}
	for name, data := range files {
		p := filepath.Join(manifests.ChartDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%s: %d files, %d changed\n", manifests.ChartDir, len(files), len(stale))
	return nil
}
