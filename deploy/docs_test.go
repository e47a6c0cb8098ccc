package deploy

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/internal/app"
)

// docBlock returns the ```sh block that follows <!-- marker --> in docs/deploy.md: the one place those
// commands are written (the cluster lane runs the same blocks on real nodes).
func docBlock(t *testing.T, marker string) string {
	t.Helper()
	data, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- " + regexp.QuoteMeta(marker) + " -->\\s*```sh\\n(.*?)```").FindSubmatch(data)
	if m == nil {
		t.Fatalf("docs/deploy.md: no ```sh block after <!-- %s -->", marker)
	}
	return string(m[1])
}

// The bundle the docs' blocks run with when their tools are recorded: this checkout's version (what
// `make -s version` prints) and a made-up digest in bin/release/<version>/image.digest.
const docsDigest = "sha256:5f0e2c8a9b7d4e3f1a6c0b9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f"

func checkoutVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../hack/version.sh").Output()
	if err != nil {
		t.Fatalf("hack/version.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// docsLayout is a directory laid out as the checkout the docs' commands run in (deploy/, hack/,
// CHANGELOG.md, and the bundle's image.digest), where they may write their overlays.
func docsLayout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{"deploy", "hack", "CHANGELOG.md"} {
		abs, err := filepath.Abs(filepath.Join("..", p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	bundle := filepath.Join(dir, "bin", "release", checkoutVersion(t))
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "image.digest"), []byte(docsDigest+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// docsOverlays runs docs/deploy.md's bundle and install blocks (tools recorded, not run) and returns
// the directory holding the overlays they wrote (my-cluster/…).
func docsOverlays(t *testing.T) string {
	t.Helper()
	dir := docsLayout(t)
	recordedRun(t, dir, docBlock(t, "bundle-steps")+docBlock(t, "install-steps"))
	return dir
}

// recordedRun runs script with bash -e in dir, with make, cosign, helm, kubectl, tar and sha256sum
// replaced by stubs that record their arguments (`make -s version` prints the checkout's version,
// kubectl get prints one pod name), and returns the calls, one per line.
func recordedRun(t *testing.T, dir, script string) []string {
	t.Helper()
	stubs := t.TempDir()
	calls := filepath.Join(stubs, "calls")
	for _, tool := range []string{"make", "cosign", "helm", "kubectl", "tar", "sha256sum"} {
		stub := "#!/bin/sh\nprintf '%s\\n' \"" + tool + " $*\" >>\"$DOC_CALLS\"\n"
		switch tool {
		case "kubectl":
			stub += "case \" $* \" in *' get '*) echo pod/network-node-manager-x7k2p ;; esac\n"
		case "make":
			stub += "[ \"$*\" != \"-s version\" ] || echo \"$DOC_VERSION\"\n"
		}
		if err := os.WriteFile(filepath.Join(stubs, tool), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+stubs+string(os.PathListSeparator)+os.Getenv("PATH"), "DOC_CALLS="+calls, "DOC_VERSION="+checkoutVersion(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the docs' block fails: %v\n%s\nblock:\n%s", err, out, script)
	}
	data, err := os.ReadFile(calls)
	if err != nil {
		t.Fatalf("the block ran none of the recorded tools: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// madeTag is the image tag `make ARGS` builds: the VERSION the Makefile hands hack/image.sh or
// hack/release.sh, read from `make -n` (which runs neither).
func madeTag(t *testing.T, args []string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"-n", "--no-print-directory", "-C", ".."}, args...)...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "VERSION=") && !strings.HasPrefix(e, "MAKEFLAGS=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %v: %v\n%s", args, err, out)
	}
	m := regexp.MustCompile(`(?m)\bVERSION=(\S+) .*\./hack/(?:image|release)\.sh`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("make %v builds no image (no hack/image.sh or hack/release.sh in make -n):\n%s", args, out)
	}
	return string(m[1])
}

// podImages returns every container image of the pod templates among objs.
func podImages(t *testing.T, objs []object) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		if pod := podSpec(t, o); pod != nil {
			for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				out = append(out, c.Image)
			}
		}
	}
	return out
}

// kubectlArgs splits a recorded kubectl call into its namespace (-n) and the rest.
func kubectlArgs(call string) (ns string, rest []string) {
	f := strings.Fields(strings.TrimPrefix(call, "kubectl "))
	for i := 0; i < len(f); i++ {
		if f[i] == "-n" && i+1 < len(f) {
			ns = f[i+1]
			i++
			continue
		}
		rest = append(rest, f[i])
	}
	return ns, rest
}

// flagValue returns the value of -x V or --x=V in args.
func flagValue(args []string, short, long string) string {
	for i, a := range args {
		if a == short && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, long+"="); ok {
			return v
		}
	}
	return ""
}

// checkKubectl checks a recorded kubectl call against what the docs' overlays render in dir:
// apply/delete -k name a kustomization; rollout status, logs -l/-c and get pods -l name objects,
// labels and containers that exist in the namespace given. applied collects what was applied.
func checkKubectl(t *testing.T, dir, call string, applied map[string][]object) {
	t.Helper()
	ns, args := kubectlArgs(call)
	if len(args) == 0 {
		t.Errorf("%q: no kubectl verb", call)
		return
	}
	var daemonSets []*appsv1.DaemonSet
	for _, objs := range applied {
		for _, o := range objs {
			if o.u.GetKind() == "DaemonSet" {
				daemonSets = append(daemonSets, typed[appsv1.DaemonSet](t, o))
			}
		}
	}
	withLabel := func(sel string) *appsv1.DaemonSet {
		k, v, _ := strings.Cut(sel, "=")
		for _, ds := range daemonSets {
			if ds.Namespace == ns && ds.Spec.Template.Labels[k] == v {
				return ds
			}
		}
		t.Errorf("%q: no pods in namespace %q carry the label %s in what the docs applied", call, ns, sel)
		return nil
	}
	switch args[0] {
	case "annotate", "label", "delete":
		sel := flagValue(args, "-l", "--selector")
		if sel == "" && args[0] == "delete" {
			goto kustomization
		}
		if k, v, _ := strings.Cut(sel, "="); !slices.ContainsFunc(slices.Collect(maps.Values(applied)), func(objs []object) bool {
			return slices.ContainsFunc(objs, func(o object) bool { return o.u.GetLabels()[k] == v })
		}) {
			t.Errorf("%q: no object the docs applied carries the label %s", call, sel)
		}
		return
	}
kustomization:
	switch args[0] {
	case "apply", "delete":
		k := flagValue(args, "-k", "--kustomize")
		if k == "" {
			t.Errorf("%q: the docs apply only kustomizations (-k)", call)
			return
		}
		objs := render(t, filepath.Join(dir, k))
		if args[0] == "apply" {
			applied[k] = objs
		} else if _, ok := applied[k]; !ok {
			t.Errorf("%q deletes what the docs never applied", call)
		}
	case "rollout":
		name, ok := strings.CutPrefix(args[len(args)-1], "daemonset/")
		if !ok || !slices.ContainsFunc(daemonSets, func(ds *appsv1.DaemonSet) bool { return ds.Name == name && ds.Namespace == ns }) {
			t.Errorf("%q: no DaemonSet %s/%s among what the docs applied", call, ns, args[len(args)-1])
		}
	case "logs":
		if ds := withLabel(flagValue(args, "-l", "--selector")); ds != nil {
			c := flagValue(args, "-c", "--container")
			spec := ds.Spec.Template.Spec
			if !slices.ContainsFunc(append(slices.Clone(spec.InitContainers), spec.Containers...), func(x corev1.Container) bool { return x.Name == c }) {
				t.Errorf("%q: DaemonSet %s has no container %q", call, ds.Name, c)
			}
		}
	case "get":
		withLabel(flagValue(args, "-l", "--selector"))
	case "exec":
		i := slices.Index(args, "--")
		if i < 0 || i+1 >= len(args) {
			t.Errorf("%q: exec without -- COMMAND", call)
			return
		}
		checkAgentCommand(t, call, args[i+1:], daemonSets)
	default:
		t.Errorf("%q: teach this test kubectl %s", call, args[0])
	}
}

// checkAgentCommand: argv runs in the agent's container, so it must be the image's binary, on the
// image's PATH, with a subcommand and flags the binary has, and a --config the container mounts.
func checkAgentCommand(t *testing.T, call string, argv []string, daemonSets []*appsv1.DaemonSet) {
	t.Helper()
	img, err := os.ReadFile("../hack/image.sh")
	if err != nil {
		t.Fatal(err)
	}
	if argv[0] != "network-node-manager" || !strings.Contains(string(img), `"$mnt/usr/local/bin/network-node-manager"`) ||
		!regexp.MustCompile(`--env PATH=\S*:/usr/local/bin:`).Match(img) {
		t.Errorf("%q: the image has network-node-manager in /usr/local/bin, on its PATH; the command is %q", call, argv[0])
	}
	root := app.NewCommand("test", fixes.Standard)
	cmd, rest, err := root.Find(argv[1:])
	if err != nil || cmd == root {
		t.Errorf("%q: %v is not a command of the agent: %v", call, argv[1:], err)
		return
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Errorf("%q: %v", call, err)
	}
	if cfg := flagValue(argv, "", "--config"); cfg != "" {
		i := slices.IndexFunc(daemonSets, func(ds *appsv1.DaemonSet) bool { return ds.Name == "network-node-manager" })
		if i < 0 {
			t.Errorf("%q: the agent's DaemonSet was not applied", call)
			return
		}
		c := daemonSets[i].Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--config="+cfg) && !slices.Contains(c.Env, corev1.EnvVar{Name: "NNM_CONFIG", Value: cfg}) {
			t.Errorf("%q: --config=%s is not the file the agent container reads (args %v, env %v)", call, cfg, c.Args, c.Env)
		}
	}
}

// checkDocsInstall runs docs/deploy.md's blocks as an operator would, in a copy of the checkout's
// layout, with the tools recorded: with kustomize the bundle, install, dry-run, kustomize-to-Helm
// and uninstall blocks; with Helm the bundle, Helm install and Helm uninstall blocks. The version
// `make release` builds is this checkout's (`make -s version`), that version is pushed (cosign load)
// and verified by digest (cosign verify), every kustomization and chart render the blocks apply runs
// exactly the pushed image by digest, and every kubectl call names objects, labels, containers and
// agent flags that exist.
func checkDocsInstall(t *testing.T) {
	version := checkoutVersion(t)
	for _, flow := range [][]string{
		{"bundle-steps+install-steps", "dry-run-steps", "helm-adopt-steps", "uninstall-steps"},
		{"bundle-steps+helm-install-steps", "helm-uninstall-steps"},
	} {
		dir := docsLayout(t)
		applied := map[string][]object{}
		var pushed string
		verified := map[string]bool{}
		preamble := ""
		for _, step := range flow {
			var script string
			for _, marker := range strings.Split(step, "+") {
				script += docBlock(t, marker)
			}
			if strings.HasPrefix(step, "bundle-steps") {
				preamble = docsVariables(script)
			} else {
				script = preamble + script
			}
			for _, call := range recordedRun(t, dir, script) {
				f := strings.Fields(call)
				switch f[0] {
				case "make":
					if f[1] == "-s" && f[2] == "version" {
						continue
					}
					if built := madeTag(t, f[1:]); built != version {
						t.Errorf("docs/deploy.md %s: %q builds %s, make -s version says %s", step, call, built, version)
					}
				case "cosign":
					switch f[1] {
					case "load":
						pushed = f[len(f)-1]
						if !strings.HasSuffix(pushed, "/network-node-manager:"+version) || flagValue(f, "--dir", "") == "" {
							t.Errorf("docs/deploy.md %s: %q does not push the bundle's image as REGISTRY/network-node-manager:%s", step, call, version)
						}
					case "verify", "verify-attestation":
						verified[f[1]] = strings.HasSuffix(f[len(f)-1], "/network-node-manager@"+docsDigest) && strings.Contains(call, "--key ")
					case "verify-blob":
						verified[f[1]] = strings.HasSuffix(call, "SHA256SUMS") && strings.Contains(call, "--signature ")
					}
				case "helm":
					checkHelm(t, call, version, applied)
				case "kubectl":
					checkKubectl(t, dir, call, applied)
				}
			}
		}
		for _, v := range []string{"verify-blob", "verify", "verify-attestation"} {
			if !verified[v] {
				t.Errorf("%v: the docs do not run cosign %s on the bundle's checksums or the pushed digest with a key", flow, v)
			}
		}
		if pushed == "" || len(applied) < 2 {
			t.Fatalf("%v: the docs' blocks push %q and apply %d sets: want one push, an install and an uninstall", flow, pushed, len(applied))
		}
		want := pushed + "@" + docsDigest
		for k, objs := range applied {
			images := podImages(t, objs)
			if len(images) == 0 && !strings.Contains(k, "adopt") {
				t.Errorf("%s: no pod template", k)
			}
			for _, img := range images {
				if img != want {
					t.Errorf("%s runs %s, the docs pushed and verified %s", k, img, want)
				}
			}
		}
		t.Logf("%v: make release builds %s, pushed as %s; applied %v", flow, version, want, slices.Sorted(maps.Keys(applied)))
	}
}

// docsVariables is the bundle block's variable assignments, for the blocks an operator runs in the
// same shell later.
func docsVariables(script string) string {
	var b strings.Builder
	for _, l := range strings.Split(script, "\n") {
		if regexp.MustCompile(`^[A-Z]+=`).MatchString(l) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// checkHelm checks a recorded helm call: install and upgrade --install render this checkout's chart
// as the bundle packages it (tag and digest set) with the call's --set values, which applied
// collects; uninstall names a release the docs installed.
func checkHelm(t *testing.T, call, version string, applied map[string][]object) {
	t.Helper()
	f := strings.Fields(call)
	switch {
	case len(f) > 3 && (f[1] == "install" || f[1] == "upgrade" && f[2] == "--install"):
		args := f[2:]
		if f[1] == "upgrade" {
			args = f[3:]
		}
		name, chart := args[0], args[1]
		if want := "bin/release/" + version + "/network-node-manager-" + strings.TrimPrefix(version, "v") + ".tgz"; chart != want {
			t.Errorf("%q: the chart %s, want the bundle's %s", call, chart, want)
		}
		if ns := flagValue(f, "--namespace", "--namespace"); ns != "kube-system" {
			t.Errorf("%q: --namespace %q, want kube-system", call, ns)
		}
		values := map[string]any{"image": map[string]any{"tag": version, "digest": docsDigest}}
		for i, a := range f {
			if a != "--set" || i+1 >= len(f) {
				continue
			}
			k, v, _ := strings.Cut(f[i+1], "=")
			m := values
			keys := strings.Split(k, ".")
			for _, key := range keys[:len(keys)-1] {
				if _, ok := m[key].(map[string]any); !ok {
					m[key] = map[string]any{}
				}
				m = m[key].(map[string]any)
			}
			var val any = v
			if v == "true" || v == "false" {
				val = v == "true"
			}
			m[keys[len(keys)-1]] = val
		}
		applied["helm "+name] = fromManifests(t, call, helmTemplate(t, values))
	case len(f) > 2 && f[1] == "uninstall":
		if _, ok := applied["helm "+f[2]]; !ok {
			t.Errorf("%q uninstalls what the docs never installed", call)
		}
	default:
		t.Errorf("%q: teach this test helm %s", call, f[1])
	}
}

func TestChainTables(t *testing.T) {
	save := "# Generated\n*mangle\n:PREROUTING ACCEPT [0:0]\n:NNM-INVALID-DROP-INPUT - [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n" +
		"*nat\n:NNM-IPVS-EXTERNALIP-DNAT - [0:0]\n:NNM-X - [0:0]\nCOMMIT\n"
	if got := chainTables(save, "NNM-"); fmt.Sprint(got) != "[mangle nat]" {
		t.Errorf("chainTables = %v, want [mangle nat]", got)
	}
}

// docFiles are the pages that quote the install's numbers: the front door, docs/, the fixes' pages,
// SECURITY.md and BENCHMARKS.md (CHANGELOG.md records history and may quote old values).
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"../README.md", "../SECURITY.md", "../BENCHMARKS.md", "../CONTRIBUTING.md"}
	for _, glob := range []string{"../docs/*.md", "../fixes/*/README.md"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	return files
}

// TestDocsQuoteTheManifests: every memory request and limit, CPU request, GOMEMLIMIT, maxUnavailable,
// agent port (94xx) and release image tag that a page quotes is the value deploy/base runs, and
// docs/deploy.md, the one page that explains them, quotes each (TestImageTagIsTheRelease does the
// same for the tag the docs build).
func TestDocsQuoteTheManifests(t *testing.T) {
	objs := render(t, "base")
	ds := typed[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "network-node-manager"))
	c := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	var ports []string
	for _, p := range c.Ports {
		ports = append(ports, fmt.Sprint(p.ContainerPort))
	}
	facts := []struct {
		name string
		re   *regexp.Regexp
		ok   func(string) bool
		want string
	}{
		{"memory request", regexp.MustCompile(`memory request (\d+[KMG]i)\b`), nil, c.Resources.Requests.Memory().String()},
		{"memory limit", regexp.MustCompile(`memory limit (\d+[KMG]i)\b|\b(\d+[KMG]i) (?:memory )?limit\b`), nil, c.Resources.Limits.Memory().String()},
		{"CPU request", regexp.MustCompile(`CPU request (\d+m?)\b`), nil, c.Resources.Requests.Cpu().String()},
		{"GOMEMLIMIT", regexp.MustCompile(`GOMEMLIMIT=(\d+[KMG]iB)\b`), nil, env["GOMEMLIMIT"]},
		{"maxUnavailable", regexp.MustCompile(`maxUnavailable:? (\d+ ?%?)`), nil, ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String()},
		{"agent port", regexp.MustCompile(`(?:\bport |:)(94\d\d)\b`), func(v string) bool { return slices.Contains(ports, v) }, strings.Join(ports, " or ")},
		{"release image tag", regexp.MustCompile(`network-node-manager:(v\d+\.\d+\.\d+)\b(?:[^-.]|$)|newTag: (v\S+)`), nil, releaseVersion(t)},
	}
	quotedInDeploy := map[string]bool{}
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// Sentences wrap: match across line ends (same offsets, so the line number stays right).
		text := strings.ReplaceAll(string(data), "\n", " ")
		for _, f := range facts {
			for _, m := range f.re.FindAllStringSubmatchIndex(text, -1) {
				var v string
				for i := 2; i < len(m); i += 2 {
					if m[i] >= 0 {
						v += text[m[i]:m[i+1]]
					}
				}
				v = strings.ReplaceAll(v, " ", "")
				good := v == f.want
				if f.ok != nil {
					good = f.ok(v)
				}
				if !good {
					t.Errorf("%s:%d quotes %s %s, deploy/base runs %s: %q", strings.TrimPrefix(file, "../"),
						strings.Count(string(data[:m[0]]), "\n")+1, f.name, v, f.want, text[m[0]:m[1]])
				}
				if filepath.Base(file) == "deploy.md" {
					quotedInDeploy[f.name] = true
				}
			}
		}
	}
	for _, f := range facts {
		if !quotedInDeploy[f.name] && f.name != "release image tag" {
			t.Errorf("docs/deploy.md does not quote the %s (%s): it is the page that explains the DaemonSet's numbers", f.name, f.want)
		}
	}
}

// TestDocsBudgetTable: docs/deploy.md's table of entries per fix at each memoryLimit is what
// fix.MaxEntriesPerFixAt gives, and it has the DaemonSet's limit among its rows.
func TestDocsBudgetTable(t *testing.T) {
	data, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| (\d+Mi) \| ([\d,]+) \| ([\d,]+) \|$`)
	rows := row.FindAllStringSubmatch(string(data), -1)
	atDefault := false
	for _, r := range rows {
		limit := resource.MustParse(r[1])
		atDefault = atDefault || limit.Value() == fix.MemoryLimit
		for i, be := range []string{backend.IPTables, backend.NFTables} {
			if want := fix.MaxEntriesPerFixAt(be, limit.Value()); strings.ReplaceAll(r[i+2], ",", "") != fmt.Sprint(want) {
				t.Errorf("docs/deploy.md: %s at %s: %s entries, fix.MaxEntriesPerFixAt gives %d", be, r[1], r[i+2], want)
			}
		}
	}
	if len(rows) < 3 || !atDefault {
		t.Errorf("docs/deploy.md: %d rows of the budget table, none at the DaemonSet's limit: %v", len(rows), rows)
	}
}

// TestNoBuildMachinePaths: no file of the repository names a path that exists only on the machine it
// was written on (a checkout, a home directory, a mirror); scripts take such paths from required
// environment variables. Pages (*.md) also name no /tmp file: a figure's command must be in the tree.
func TestNoBuildMachinePaths(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dirs := []string{"work", "root", "home", "Users", "mnt", "srv", "opt"}
	machine := regexp.MustCompile("(?:^|[\\s\"'`(=,\\[])(/(?:" + strings.Join(dirs, "|") + ")/[^\\s`'\",;)]*)")
	tmp := regexp.MustCompile("(?:^|[\\s\"'`(=,\\[])(/tmp/[^\\s`'\",;)]*)")
	self, _ := filepath.Abs("docs_test.go")
	checked := 0
	for _, f := range strings.Fields(string(out)) {
		p := filepath.Join("..", f)
		if abs, _ := filepath.Abs(p); abs == self || strings.HasPrefix(f, "bin/") {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil || slices.Contains(data, 0) {
			continue // deleted in the work tree, or binary
		}
		checked++
		for n, line := range strings.Split(string(data), "\n") {
			if m := machine.FindStringSubmatch(line); m != nil {
				t.Errorf("%s:%d names %s, a path of one machine: take it from a required environment variable", f, n+1, m[1])
			}
			if m := tmp.FindStringSubmatch(line); m != nil && strings.HasSuffix(f, ".md") {
				t.Errorf("%s:%d names %s: a page's command must use files in the tree", f, n+1, m[1])
			}
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d files: git ls-files did not list the repository", checked)
	}
}

// TestREADMEIsTheFrontDoor: README.md stays the page an operator reads first: at most 150 lines, no
// table cell a page long, the two set-up commands, and links to where the rest went.
func TestREADMEIsTheFrontDoor(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if n := strings.Count(text, "\n"); n > 150 {
		t.Errorf("README.md has %d lines, at most 150: developer material goes to docs/development.md or CONTRIBUTING.md", n)
	}
	for n, line := range strings.Split(text, "\n") {
		for _, cell := range strings.Split(line, "|") {
			if len(cell) > 500 {
				t.Errorf("README.md:%d has a table cell of %d characters: put the detail in the linked page", n+1, len(cell))
			}
		}
	}
	for _, want := range []string{"DEMO_ONCE=1 make demo", "make test ", "docs/deploy.md#install", "docs/deploy.md#support-matrix",
		"docs/operations.md", "docs/development.md", "SECURITY.md", "CONTRIBUTING.md", "BENCHMARKS.md"} {
		if !strings.Contains(text, want) {
			t.Errorf("README.md does not show %q", want)
		}
	}
}

// TestBenchmarksOneCurrentTable: BENCHMARKS.md opens with one table of current figures, each row
// naming the command (a letter defined above the table) that measures it, and no page is a dated
// diary: no heading carries a date (the history is in git and CHANGELOG.md).
func TestBenchmarksOneCurrentTable(t *testing.T) {
	data, err := os.ReadFile("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	_, current, ok := strings.Cut(string(data), "\n## Current figures\n")
	if !ok {
		t.Fatal("BENCHMARKS.md has no section \"Current figures\"")
	}
	current, _, _ = strings.Cut(current, "\n## ")
	commands := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^- \\*\\*([A-Z])\\*\\* `[^`]+`").FindAllStringSubmatch(current, -1) {
		commands[m[1]] = true
	}
	rows := 0
	for _, line := range strings.Split(current, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "| ") || len(cells) < 3 || strings.HasPrefix(line, "| figure") {
			continue
		}
		rows++
		if cmd := strings.TrimSpace(cells[len(cells)-1]); !commands[cmd] {
			t.Errorf("BENCHMARKS.md row %q names command %q, which is not among the commands listed (%v)", cells[0], cmd, slices.Sorted(maps.Keys(commands)))
		}
	}
	if rows < 5 || len(commands) == 0 {
		t.Errorf("BENCHMARKS.md's current table has %d rows and %d commands", rows, len(commands))
	}
	if strings.Count(string(data), "\n| figure") != 1 {
		t.Error("BENCHMARKS.md must hold one table of figures")
	}
	dated := regexp.MustCompile(`(?m)^#+ .*\b20\d\d-\d\d-\d\d\b`)
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range dated.FindAllString(string(b), -1) {
			t.Errorf("%s: dated heading %q: a page says what is, git and CHANGELOG.md say when", strings.TrimPrefix(f, "../"), h)
		}
	}
}

// TestDocsAgentCommandsParse: every agent command line in the pages' shell blocks (bin/network-node-manager
// plan …, network-node-manager cleanup …) names a subcommand and flags the binary has.
func TestDocsAgentCommandsParse(t *testing.T) {
	block := regexp.MustCompile("(?s)```sh\\n(.*?)```")
	cmdLine := regexp.MustCompile(`(?:^|[\s/])network-node-manager ((?:run|plan|cleanup|version)\b[^#|;&]*)`)
	root := app.NewCommand("test", fixes.Standard)
	n := 0
	for _, f := range docFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range block.FindAllStringSubmatch(string(data), -1) {
			for line := range strings.Lines(b[1]) {
				m := cmdLine.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				n++
				cmd, rest, err := root.Find(strings.Fields(m[1]))
				if err == nil {
					err = cmd.ParseFlags(rest)
				}
				if err != nil {
					t.Errorf("%s: %q: %v", strings.TrimPrefix(f, "../"), strings.TrimSpace(line), err)
				}
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d agent command lines in the pages' shell blocks, want at least plan and cleanup --dry-run", n)
	}
}

// TestSecurityListsEveryGrant: SECURITY.md's table of the agent's API permissions has a row per
// rule that deploy/base and its stale-udp-conntrack component grant the agent's ServiceAccount (the
// resource, each verb and the role), and no row for a resource they do not grant.
func TestSecurityListsEveryGrant(t *testing.T) {
	data, err := os.ReadFile("../SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "| `") {
			rows = append(rows, line)
		}
	}
	objs := render(t, "overlays/stale-udp-conntrack")
	bound := map[string]bool{} // "ClusterRole/name", "Role/ns/name" bound to the agent
	for _, o := range objs {
		if k := o.u.GetKind(); k == "ClusterRoleBinding" || k == "RoleBinding" {
			b := typed[rbacv1.RoleBinding](t, o)
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == agentSA && s.Namespace == agentNS {
					key := b.RoleRef.Kind + "/" + b.RoleRef.Name
					if b.RoleRef.Kind == "Role" {
						key = "Role/" + b.Namespace + "/" + b.RoleRef.Name
					}
					bound[key] = true
				}
			}
		}
	}
	granted := map[string]bool{}
	for _, o := range objs {
		k := o.u.GetKind()
		if k != "ClusterRole" && k != "Role" {
			continue
		}
		role := typed[rbacv1.ClusterRole](t, o)
		name, key := role.Name, k+"/"+role.Name
		if k == "Role" {
			name, key = role.Namespace+"/"+role.Name, "Role/"+role.Namespace+"/"+role.Name
		}
		if !bound[key] {
			continue
		}
		for _, r := range role.Rules {
			for _, res := range r.Resources {
				granted[res] = true
				i := slices.IndexFunc(rows, func(row string) bool {
					if !strings.Contains(row, "`"+res+"`") || !strings.Contains(row, "`"+name+"`") {
						return false
					}
					for _, v := range r.Verbs {
						if !regexp.MustCompile(`\b` + v + `\b`).MatchString(row) {
							return false
						}
					}
					return true
				})
				if i < 0 {
					t.Errorf("SECURITY.md has no row for %s %v %v (%s %s)", res, r.Verbs, r.ResourceNames, k, name)
				}
			}
		}
	}
	for _, row := range rows {
		res := strings.Trim(strings.Fields(strings.TrimPrefix(row, "| "))[0], "`")
		if strings.Contains(res, ".") { // an API group (networking.k8s.io) before the resource
			res = strings.Trim(strings.Fields(strings.TrimPrefix(row, "| "))[1], "`")
		}
		if !granted[res] {
			t.Errorf("SECURITY.md lists %q, which the manifests do not grant the agent: %s", res, row)
		}
	}
}

// TestDocsKubectlNamesExist: every object a page's kubectl command names (daemonset/…, job/…,
// configmap …, secret …) is one the manifests the docs apply create, in the namespace the command
// gives.
func TestDocsKubectlNamesExist(t *testing.T) {
	have := map[string]bool{} // "kind namespace/name"
	for _, load := range manifestSets {
		for _, o := range load(t) {
			have[strings.ToLower(o.u.GetKind())+" "+o.u.GetNamespace()+"/"+o.u.GetName()] = true
		}
	}
	kubectl := regexp.MustCompile("kubectl[^`\\n]*")
	named := regexp.MustCompile(`\b(daemonset|job)/([a-z0-9-]+)|\b(configmap|secret) ([a-z0-9-]+)`)
	ns := regexp.MustCompile(`-n ([a-z0-9-]+)`)
	n := 0
	for _, f := range docFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, cmd := range kubectl.FindAllString(string(data), -1) {
			namespace := "default"
			if m := ns.FindStringSubmatch(cmd); m != nil {
				namespace = m[1]
			}
			for _, m := range named.FindAllStringSubmatch(cmd, -1) {
				kind, name := m[1]+m[3], m[2]+m[4]
				n++
				if !have[kind+" "+namespace+"/"+name] {
					t.Errorf("%s: %q names %s %s/%s, which no manifest set the docs apply creates", strings.TrimPrefix(f, "../"), cmd, kind, namespace, name)
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("found %d named objects in the pages' kubectl commands", n)
	}
}

// TestChangelogIsForOperators: CHANGELOG.md says what changed for operators, at most 60 lines a
// release (figures live in BENCHMARKS.md, how a lane measured something in docs/development.md),
// and every release section's heading is a version (or Unreleased).
func TestChangelogIsForOperators(t *testing.T) {
	data, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := regexp.MustCompile(`(?m)^## `).Split(string(data), -1)[1:]
	if len(sections) < 2 {
		t.Fatalf("CHANGELOG.md has %d sections, want Unreleased and at least one release", len(sections))
	}
	for _, s := range sections {
		heading, _, _ := strings.Cut(s, "\n")
		if !regexp.MustCompile(`^(Unreleased|v\d+\.\d+\.\d+)\b`).MatchString(heading) {
			t.Errorf("CHANGELOG.md section %q: want Unreleased or vX.Y.Z", heading)
		}
		if n := strings.Count(strings.TrimSpace(s), "\n"); n > 60 {
			t.Errorf("CHANGELOG.md section %q has %d lines: at most 60 (figures belong in BENCHMARKS.md)", heading, n)
		}
	}
}
