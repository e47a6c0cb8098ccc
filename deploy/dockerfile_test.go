package deploy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/network-node-manager/network-node-manager/internal/config"
)

// No Docker engine runs in CI, so the image cannot be built there. This test checks the Dockerfile
// against the repository instead: the Go version, the package it builds, the -X variable, the binary
// path between the stages, the tools the runtime installs (against this Debian 12 host's package
// database, the same release as the bookworm-slim runtime), and that .dockerignore keeps what the
// build needs.

type dockerfile struct {
	stages []stage
}

type stage struct {
	from, name string
	lines      []string // instructions with continuations joined
}

func parseDockerfile(t *testing.T, file string) dockerfile {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var df dockerfile
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		fields := strings.Fields(line)
		if strings.EqualFold(fields[0], "FROM") {
			s := stage{from: fields[1]}
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
				s.name = fields[3]
			}
			df.stages = append(df.stages, s)
			return
		}
		if len(df.stages) == 0 {
			if !strings.EqualFold(fields[0], "ARG") {
				t.Fatalf("%s: %q before the first FROM", file, line)
			}
			return
		}
		df.stages[len(df.stages)-1].lines = append(df.stages[len(df.stages)-1].lines, line)
	}
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			cur.WriteString(strings.TrimSuffix(l, `\`) + " ")
			continue
		}
		cur.WriteString(l)
		flush()
	}
	flush()
	return df
}

func (s stage) find(instr string) []string {
	var out []string
	for _, l := range s.lines {
		if f := strings.Fields(l); strings.EqualFold(f[0], instr) {
			out = append(out, strings.TrimSpace(l[len(f[0]):]))
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	root, _ := filepath.Abs("..")
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	if len(df.stages) != 2 || df.stages[0].name != "build" {
		t.Fatalf("want two stages (build, runtime), got %+v", df.stages)
	}
	build, runtime := df.stages[0], df.stages[1]

	// The Go image matches go.mod's go line (major.minor).
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil || !strings.HasPrefix(build.from, "golang:"+string(m[1])) {
		t.Errorf("build stage FROM %s, go.mod says go %s", build.from, m[1])
	}

	// The build command: static, the agent's package, main.version, an output path.
	var goBuild string
	for _, r := range build.find("RUN") {
		if strings.Contains(r, "go build") {
			goBuild = r
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-X main.version=", "-X main.commit="} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("go build %q lacks %s", goBuild, want)
		}
	}
	pkg := regexp.MustCompile(`\s(\./cmd/[\w/-]+)`).FindStringSubmatch(goBuild)
	out := regexp.MustCompile(`-o\s+(\S+)`).FindStringSubmatch(goBuild)
	if pkg == nil || out == nil {
		t.Fatalf("go build %q: no package or -o", goBuild)
	}
	mainGo, err := os.ReadFile(filepath.Join(root, pkg[1], "main.go"))
	if err != nil {
		t.Fatalf("the Dockerfile builds %s: %v", pkg[1], err)
	}
	for _, v := range []string{"version", "commit"} {
		if !regexp.MustCompile(`(?m)^package main$`).Match(mainGo) || !regexp.MustCompile(`(?m)^(var)?\s*`+v+`\s*=`).Match(mainGo) {
			t.Errorf("%s/main.go must be package main with a %s variable for -X main.%s", pkg[1], v, v)
		}
	}

	// The runtime copies that binary and runs it; its other copies are files of the build context
	// (imageFiles).
	copies := runtime.find("COPY")
	if len(copies) != 1+len(imageFiles(t, runtime)) {
		t.Fatalf("runtime COPY = %v", copies)
	}
	cf := strings.Fields(copies[0])
	if len(cf) != 3 || cf[0] != "--from="+build.name || cf[1] != out[1] {
		t.Errorf("runtime COPY %q must copy %s from stage %s", copies[0], out[1], build.name)
	}
	entry := runtime.find("ENTRYPOINT")
	if len(entry) != 1 || entry[0] != `["`+cf[2]+`"]` {
		t.Errorf("ENTRYPOINT %v must be the copied binary %s", entry, cf[2])
	}
	if path.Base(cf[2]) != "network-node-manager" {
		t.Errorf("binary name %s", cf[2])
	}

	// EXPOSE lists the container ports of deploy/base's DaemonSet (TestDaemonSet checks those against
	// the ConfigMap's addresses), and the metrics port is the one of the built-in default.
	ds := typed[appsv1.DaemonSet](t, find(t, render(t, "base"), "DaemonSet", "network-node-manager"))
	var ports []string
	for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
		ports = append(ports, fmt.Sprint(p.ContainerPort))
	}
	if expose := runtime.find("EXPOSE"); len(expose) != 1 || !slices.Equal(strings.Fields(expose[0]), ports) {
		t.Errorf("EXPOSE %v, want the DaemonSet's container ports %v", expose, ports)
	}
	if _, port, _ := net.SplitHostPort(config.Defaults().MetricsAddress); len(ports) == 0 || port != ports[0] {
		t.Errorf("the default metricsAddress port %s is not the image's first port %v", port, ports)
	}

	// The runtime packages provide every tool the agent executes (checked against this Debian host).
	var install string
	for _, r := range runtime.find("RUN") {
		if strings.Contains(r, "apt-get install") {
			install = r
		}
	}
	pkgs := map[string]bool{}
	for _, p := range []string{"iptables", "nftables"} {
		if !regexp.MustCompile(`\s` + p + `(=\S+)?(\s|$)`).MatchString(install) {
			t.Errorf("runtime does not install %s: %q", p, install)
		}
		pkgs[p] = true
	}
	if !strings.Contains(runtime.from, "bookworm") {
		t.Errorf("runtime FROM %s: the package check below assumes Debian bookworm", runtime.from)
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Log("no dpkg: skipping the package-content check")
		return
	}
	tools := []string{"nft"}
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, v := range []string{"nft", "legacy"} {
			for _, tool := range []string{"-save", "-restore", ""} {
				tools = append(tools, bin+"-"+v+tool)
			}
		}
	}
	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Errorf("%s is not installed on this host; cannot check which package provides it", tool)
			continue
		}
		outb, err := exec.Command("dpkg", "-S", p).Output()
		if err != nil {
			// /usr/sbin may be a merged-/usr symlink target; try the /sbin spelling.
			outb, err = exec.Command("dpkg", "-S", strings.Replace(p, "/usr/sbin", "/sbin", 1)).Output()
		}
		owner, _, _ := strings.Cut(string(outb), ":")
		if err != nil || !pkgs[owner] {
			t.Errorf("%s (%s) comes from package %q, not from the image's iptables/nftables: %v", tool, p, owner, err)
		}
	}
}

// .dockerignore must not drop a file the build stage needs: go.mod, go.sum and every package the
// agent is built from.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	root, _ := filepath.Abs("..")
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "!") {
				t.Fatalf(".dockerignore: exceptions (%s) are not understood by this test", l)
			}
			patterns = append(patterns, l)
		}
	}
	ignored := func(rel string) string {
		parts := strings.Split(rel, "/")
		for _, p := range patterns {
			for i := range parts {
				prefix := strings.Join(parts[:i+1], "/")
				if ok, _ := path.Match(p, prefix); ok {
					return p
				}
				if rest, ok := strings.CutPrefix(p, "**/"); ok {
					if ok, _ := path.Match(rest, parts[i]); ok {
						return p
					}
				}
			}
		}
		return ""
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "./cmd/network-node-manager")
	cmd.Dir = root
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, dir := range strings.Fields(string(outb)) {
		if rel, err := filepath.Rel(root, dir); err == nil && !strings.HasPrefix(rel, "..") {
			needed = append(needed, filepath.ToSlash(rel)+"/x.go")
		}
	}
	if len(needed) < 5 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, n := range needed {
		if p := ignored(n); p != "" {
			t.Errorf(".dockerignore pattern %q drops %s, which the image build needs", p, path.Dir(n))
		}
	}
	for _, n := range []string{"bin/network-node-manager", ".git/HEAD", "core/testkit/testdata/x.golden"} {
		if ignored(n) == "" {
			t.Errorf(".dockerignore should keep %s out of the build context", n)
		}
	}
}

// hack/image.sh (make image, no Docker engine) builds what the Dockerfile builds: the same Debian
// release and packages, the agent built with the same flags at the same path, the same entrypoint,
// command, user and port.
func TestImageScriptMatchesDockerfile(t *testing.T) {
	root, _ := filepath.Abs("..")
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	build, runtime := df.stages[0], df.stages[1]
	script, err := os.ReadFile(filepath.Join(root, "hack", "image.sh"))
	if err != nil {
		t.Fatal(err)
	}
	sh := string(script)
	field := func(re string) string {
		m := regexp.MustCompile(re).FindStringSubmatch(sh)
		if m == nil {
			t.Fatalf("hack/image.sh: no match for %s", re)
		}
		return m[1]
	}
	if suite := field(`(?m)^SUITE=(\S+)`); !strings.Contains(runtime.from, suite) {
		t.Errorf("image.sh debootstraps %s, the Dockerfile runs on %s", suite, runtime.from)
	}
	var install string
	for _, r := range runtime.find("RUN") {
		if strings.Contains(r, "apt-get install") {
			install = r
		}
	}
	// The Dockerfile installs each package at the version hack/image/'s locks pin (the same for
	// every architecture).
	locked := map[string]string{}
	locks, _ := filepath.Glob(filepath.Join(root, "hack", "image", field(`(?m)^SUITE=(\S+)`)+"-*.lock"))
	if len(locks) == 0 {
		t.Fatalf("no hack/image/%s-<arch>.lock", field(`(?m)^SUITE=(\S+)`))
	}
	for _, lock := range locks {
		data, err := os.ReadFile(lock)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if p, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
				if prev, seen := locked[p]; seen && prev != v && strings.Contains(install, p+"=") {
					t.Errorf("%s: %s=%s, another architecture's lock pins %s", lock, p, v, prev)
				}
				locked[p] = v
			}
		}
	}
	for _, p := range strings.Split(field(`(?m)^PACKAGES=(\S+)`), ",") {
		if !regexp.MustCompile(`\s` + regexp.QuoteMeta(p+"="+locked[p]) + `(\s|$)`).MatchString(install) {
			t.Errorf("image.sh includes %s, pinned at %s; the Dockerfile does not install that version: %q", p, locked[p], install)
		}
	}
	var goBuild string
	for _, r := range build.find("RUN") {
		if strings.Contains(r, "go build") {
			goBuild = r
		}
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", `-s -w -X main.version=`, `-X main.commit=`, "./cmd/network-node-manager"} {
		if !strings.Contains(goBuild, flag) || !strings.Contains(sh, flag) {
			t.Errorf("go build flag %q: Dockerfile %v, image.sh %v", flag, strings.Contains(goBuild, flag), strings.Contains(sh, flag))
		}
	}
	cf := strings.Fields(runtime.find("COPY")[0])
	if !strings.Contains(sh, `"$mnt`+cf[2]+`"`) {
		t.Errorf("image.sh does not install the agent at the Dockerfile's %s", cf[2])
	}
	for src, dst := range imageFiles(t, runtime) {
		if !regexp.MustCompile(`install -D -m 0644 "\$(ROOT|SRC)/` + regexp.QuoteMeta(src) + `" "\$mnt` + regexp.QuoteMeta(dst) + `"`).MatchString(sh) {
			t.Errorf("image.sh does not install %s at %s as the Dockerfile does", src, dst)
		}
	}
	if e := runtime.find("ENTRYPOINT")[0]; !strings.Contains(sh, "--entrypoint '"+e+"'") {
		t.Errorf("image.sh entrypoint differs from the Dockerfile's %s", e)
	}
	cmd := strings.Trim(runtime.find("CMD")[0], `[]"`)
	if !strings.Contains(sh, "--cmd "+cmd+" ") {
		t.Errorf("image.sh cmd differs from the Dockerfile's %s", cmd)
	}
	if u := runtime.find("USER")[0]; !strings.Contains(sh, "--user "+u+" ") {
		t.Errorf("image.sh user differs from the Dockerfile's %s", u)
	}
	for _, p := range strings.Fields(runtime.find("EXPOSE")[0]) {
		if !strings.Contains(sh, "--port "+p+" ") {
			t.Errorf("image.sh does not expose the Dockerfile's port %s", p)
		}
	}
}

// imageFiles are the runtime stage's copies from the build context (source → path in the image),
// each a file of the repository.
func imageFiles(t *testing.T, runtime stage) map[string]string {
	files := map[string]string{}
	for _, c := range runtime.find("COPY") {
		f := strings.Fields(c)
		if len(f) != 2 || strings.HasPrefix(f[0], "--") {
			continue
		}
		if _, err := os.Stat(filepath.Join("..", f[0])); err != nil {
			t.Errorf("the Dockerfile copies %s: %v", f[0], err)
		}
		files[f[0]] = f[1]
	}
	return files
}
