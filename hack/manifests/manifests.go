// Package manifests renders deploy/'s kustomizations with kustomize itself (sigs.k8s.io/kustomize/api,
// the version kubectl embeds), generates the Helm chart deploy/helm/network-node-manager from them
// (chart.go), and compares rendered object sets (the chart's render against kustomize's, a release
// bundle's install.yaml against its chart). Its command is hack/manifests/cmd/manifests.
package manifests

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Object is one rendered Kubernetes object.
type Object map[string]any

// ID is "Kind namespace/name".
func (o Object) ID() string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + " " + ns + "/" + name
}

// YAML is the object as YAML.
func (o Object) YAML() []byte {
	data, err := yaml.Marshal(map[string]any(o))
	if err != nil {
		panic(err) // an Object holds only what yaml.Unmarshal produced
	}
	return data
}

// Render returns what `kubectl kustomize dir` prints, as objects in kustomize's order.
func Render(dir string) ([]Object, error) {
	return run(filesys.MakeFsOnDisk(), dir)
}

// RenderWith renders deploy/base (or another kustomization under root/deploy, named by base relative
// to it) with the named components of root/deploy/components and an images entry, the way an
// overlay of the operator's would: resources [base], components [...], images [image]. An empty
// image changes no image.
func RenderWith(root, base string, components []string, image *Image) ([]Object, error) {
	fsys, err := deployFS(root)
	if err != nil {
		return nil, err
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
		"resources": []string{"../deploy/" + base},
	}
	var comps []string
	for _, c := range components {
		comps = append(comps, "../deploy/components/"+c)
	}
	if len(comps) > 0 {
		k["components"] = comps
	}
	if image != nil {
		k["images"] = []Image{*image}
	}
	data, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := fsys.WriteFile("/overlay/kustomization.yaml", data); err != nil {
		return nil, err
	}
	return run(fsys, "/overlay")
}

// Image is kustomize's images entry.
type Image struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// deployFS is an in-memory copy of root/deploy at /deploy: kustomize refuses absolute resource
// paths, and an overlay beside a copy needs no file in the checkout.
func deployFS(root string) (filesys.FileSystem, error) {
	fsys := filesys.MakeFsInMemory()
	src := filepath.Join(root, "deploy")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(rel, ".go") || strings.HasPrefix(rel, "helm"+string(filepath.Separator)) {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return fsys.WriteFile(path.Join("/deploy", filepath.ToSlash(rel)), data)
	})
	return fsys, err
}

func run(fsys filesys.FileSystem, dir string) ([]Object, error) {
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionUnspecified // as `kubectl kustomize`: the legacy order unless the kustomization sorts
	m, err := krusty.MakeKustomizer(opts).Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	data, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// Parse splits a YAML stream into objects, skipping empty documents (as kubectl apply -f does).
func Parse(data []byte) ([]Object, error) {
	var out []Object
	for i, doc := range splitDocs(data) {
		var o Object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(o) == 0 {
			continue
		}
		out = append(out, o)
	}
	return out, nil
}

func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		if t := bytes.TrimRight(l, " \t\r\n"); bytes.Equal(t, []byte("---")) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.Write(l)
	}
	return append(docs, cur.Bytes())
}

// Diff compares two object sets as `kubectl apply` would see them: by ID, then field by field. It
// returns one line per difference, nothing when they are equal.
func Diff(a, b []Object) []string {
	index := func(objs []Object) map[string]Object {
		m := map[string]Object{}
		for _, o := range objs {
			m[o.ID()] = o
		}
		return m
	}
	ma, mb := index(a), index(b)
	var out []string
	for id, oa := range ma {
		ob, ok := mb[id]
		if !ok {
			out = append(out, "only in the first: "+id)
			continue
		}
		out = append(out, diffValue(id, map[string]any(oa), map[string]any(ob))...)
	}
	for id := range mb {
		if _, ok := ma[id]; !ok {
			out = append(out, "only in the second: "+id)
		}
	}
	sort.Strings(out)
	return out
}

func diffValue(p string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		var out []string
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		for k := range keys {
			out = append(out, diffValue(p+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, diffValue(fmt.Sprintf("%s[%d]", p, i), av[i], bv[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: %s ≠ %s", p, short(a), short(b))}
}

func short(v any) string {
	if v == nil {
		return "(absent)"
	}
	data, _ := yaml.Marshal(v)
	s := strings.TrimSpace(string(data))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// Marshal writes objects as one YAML stream.
func Marshal(objs []Object) []byte {
	var b bytes.Buffer
	for i, o := range objs {
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(o.YAML())
	}
	return b.Bytes()
}
