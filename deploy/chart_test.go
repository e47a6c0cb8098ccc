package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/mssclamp"
	"github.com/network-node-manager/network-node-manager/hack/manifests"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// The Helm chart (deploy/helm/network-node-manager) is generated from deploy/'s kustomizations
// (make helm-chart, hack/manifests): one source. These tests prove that the committed chart is what
// the kustomizations generate, and that Helm (bin/helm, built from helm.sh/helm/v4 by
// hack/build-release-tools.sh) renders exactly the objects kustomize renders, for the defaults, every
// component, an operator's registry and digest, the hot-reload choice and the cleanup.

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestHelmChartIsGenerated: the chart in the repository is exactly what deploy/ generates.
func TestHelmChartIsGenerated(t *testing.T) {
	root := repoRoot(t)
	files, err := manifests.Chart(root, releaseVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, manifests.ChartDir)
	have := map[string]bool{}
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			have[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s/%s is not what deploy/ generates (%v): run make helm-chart", manifests.ChartDir, name, err)
		}
		delete(have, name)
	}
	for name := range have {
		t.Errorf("%s/%s is not generated from deploy/: run make helm-chart", manifests.ChartDir, name)
	}
}

// helm returns bin/helm, which hack/build-release-tools.sh builds (make test does).
func helm(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(controlplane.BinDirEnv)
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "bin")
	}
	p := filepath.Join(dir, "helm")
	if _, err := os.Stat(p); err != nil {
		netns.Unavailable(t, "%s missing: run `hack/build-release-tools.sh helm` (make test does)", p)
	}
	return p
}

// helmTemplate is `helm template network-node-manager CHART -n kube-system` with values.
func helmTemplate(t *testing.T, values map[string]any) []manifests.Object {
	t.Helper()
	args := []string{"template", "network-node-manager", filepath.Join(repoRoot(t), manifests.ChartDir), "--namespace", "kube-system"}
	if len(values) > 0 {
		data, err := yaml.Marshal(values)
		if err != nil {
			t.Fatal(err)
		}
		// (not under t.TempDir(): helm splits --values at commas, which a subtest's name may hold)
		dir, err := os.MkdirTemp("", "nnm-helm-values-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		f := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	cmd := exec.Command(helm(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	objs, err := manifests.Parse(out)
	if err != nil {
		t.Fatalf("helm template output: %v", err)
	}
	return objs
}

func kustomizeWith(t *testing.T, base string, components []string, image *manifests.Image) []manifests.Object {
	t.Helper()
	objs, err := manifests.RenderWith(repoRoot(t), base, components, image)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func sameObjects(t *testing.T, what string, helmObjs, kustomizeObjs []manifests.Object) {
	t.Helper()
	if d := manifests.Diff(helmObjs, kustomizeObjs); len(d) > 0 {
		t.Errorf("%s: helm template (first) and kustomize (second) differ:\n%s", what, strings.Join(d, "\n"))
		return
	}
	t.Logf("%s: helm and kustomize render the same %d objects", what, len(helmObjs))
}

// TestHelmChartRendersTheKustomizations: with its defaults the chart renders deploy/base + the
// release component; with a component's value, base + that component; with every value at once,
// base + every component; with a registry and a digest, what an overlay's images entry makes; with
// configRollout false, base + components/config-hot-reload; with cleanup, deploy/uninstall.
func TestHelmChartRendersTheKustomizations(t *testing.T) {
	sameObjects(t, "defaults", helmTemplate(t, nil), kustomizeWith(t, "base", nil, nil))
	all := map[string]any{}
	var allDirs []string
	for _, c := range manifests.ChartComponents {
		sameObjects(t, "components."+c.Value, helmTemplate(t, map[string]any{"components": map[string]any{c.Value: true}}),
			kustomizeWith(t, "base", []string{c.Dir}, nil))
		all[c.Value] = true
		allDirs = append(allDirs, c.Dir)
	}
	sameObjects(t, "every component", helmTemplate(t, map[string]any{"components": all}), kustomizeWith(t, "base", allDirs, nil))
	const (
		registry = "registry.example.com:5000/mirror"
		tag      = "v9.8.7-dev.3.g0123456789ab"
		digest   = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	)
	image := &manifests.Image{Name: "network-node-manager", NewName: registry + "/network-node-manager", NewTag: tag, Digest: digest}
	imageValues := map[string]any{"registry": registry, "tag": tag, "digest": digest}
	sameObjects(t, "image registry, tag and digest", helmTemplate(t, map[string]any{"image": imageValues}), kustomizeWith(t, "base", nil, image))
	sameObjects(t, "configRollout false", helmTemplate(t, map[string]any{"configRollout": false}), kustomizeWith(t, "base", []string{"config-hot-reload"}, nil))
	sameObjects(t, "cleanup", helmTemplate(t, map[string]any{"cleanup": true, "image": imageValues}), kustomizeWith(t, "uninstall", nil, image))
}

// TestHelmChartValues: what the values operators change do to the DaemonSet and the ConfigMap. A
// config change (a fix enabled, nodeOverrides) is a ConfigMap of another name (kustomize's hash of
// the new file), so the pod template changes and the DaemonSet rolls; the file still loads.
func TestHelmChartValues(t *testing.T) {
	objs := helmTemplate(t, map[string]any{
		"config": map[string]any{
			"fixes": map[string]any{mssclamp.ID: map[string]any{"enabled": true}},
			"nodeOverrides": []any{map[string]any{
				"nodeSelector": map[string]any{"matchLabels": map[string]any{"pool": "canary"}},
				"fixes":        map[string]any{"conntrack-liberal": map[string]any{"enabled": true}},
			}},
		},
		"resources":         map[string]any{"requests": map[string]any{"cpu": "50m", "memory": "96Mi"}, "limits": map[string]any{"memory": "256Mi"}},
		"goMemLimit":        "128MiB",
		"tolerations":       []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "net", "effect": "NoSchedule"}},
		"priorityClassName": "network-critical",
		"updateStrategy":    map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": "10%"}},
		"minReadySeconds":   30,
		"extraEnv":          []any{map[string]any{"name": "GOGC", "value": "100"}},
	})
	got := fromManifests(t, "helm template", objs)
	ds := typed[appsv1.DaemonSet](t, find(t, got, "DaemonSet", "network-node-manager"))
	cmObj := find(t, got, "ConfigMap", "network-node-manager")
	cm := typed[corev1.ConfigMap](t, cmObj)
	base := typed[corev1.ConfigMap](t, find(t, render(t, "base"), "ConfigMap", "network-node-manager"))
	if cm.Name == base.Name {
		t.Errorf("a changed config kept the ConfigMap's name %s: the DaemonSet would not roll", cm.Name)
	}
	if want := "network-node-manager-" + manifests.KustomizeHash(cm.Data); cm.Name != want {
		t.Errorf("ConfigMap %s, want %s (kustomize's name for that content)", cm.Name, want)
	}
	var vol string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			vol = v.ConfigMap.Name
		}
	}
	if vol != cm.Name {
		t.Errorf("the DaemonSet mounts ConfigMap %q, the chart renders %q", vol, cm.Name)
	}
	cfg := loadConfigMap(t, cm)
	if on, set := cfg.FixEnabled(mssclamp.ID); !on || !set {
		t.Errorf("config.fixes.%s.enabled: true did not reach the file:\n%s", mssclamp.ID, cm.Data["config.yaml"])
	}
	if len(cfg.NodeOverrides()) != 1 {
		t.Errorf("config.nodeOverrides: the file has %d overrides, want 1", len(cfg.NodeOverrides()))
	}
	if !strings.Contains(cm.Data["config.yaml"], "pool: canary") || !strings.Contains(cm.Data["config.yaml"], "metricsSecure: true") {
		t.Errorf("the merged file lacks the nodeOverrides or the default keys:\n%s", cm.Data["config.yaml"])
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	check := func(ok bool, format string, args ...any) {
		t.Helper()
		if !ok {
			t.Errorf(format, args...)
		}
	}
	check(c.Resources.Limits.Memory().String() == "256Mi" && c.Resources.Requests.Cpu().String() == "50m", "resources %+v", c.Resources)
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	check(env["GOMEMLIMIT"] == "128MiB" && env["GOGC"] == "100", "env %v: want GOMEMLIMIT 128MiB and the extra GOGC", env)
	check(len(spec.Tolerations) == 1 && spec.Tolerations[0].Key == "dedicated", "tolerations %+v", spec.Tolerations)
	check(spec.PriorityClassName == "network-critical", "priorityClassName %q", spec.PriorityClassName)
	check(ds.Spec.UpdateStrategy.RollingUpdate != nil && ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String() == "10%", "updateStrategy %+v", ds.Spec.UpdateStrategy)
	check(ds.Spec.MinReadySeconds == 30, "minReadySeconds %d", ds.Spec.MinReadySeconds)
}
