package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/hack/manifests"
)

// docs/deploy.md's blocks: the shell block after a marker ("<!-- install-steps -->", ...), run for
// real with bash -e from the root of this checkout (as the doc says), in the control plane's
// namespace, where the lane's registry is on the nodes' bridge (release_test.go: Cluster.run).

const installMarker = "<!-- install-steps -->"

var shFenceRE = regexp.MustCompile("(?s)\\A\\s*```sh\\n(.*?)\\n```")

// docBlock returns the shell block right after marker in docs/deploy.md.
func docBlock(t *testing.T, root, marker string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs/deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), marker)
	m := shFenceRE.FindStringSubmatch(after)
	if !ok || m == nil {
		t.Fatalf("docs/deploy.md: want a ```sh block right after %s", marker)
	}
	return m[1]
}

// installSteps returns the doc's kustomize install script (after its bundle steps).
func installSteps(t *testing.T, root string) string { return docBlock(t, root, installMarker) }

// docsScript runs one of the doc's blocks as the install ran them: bash -e in the checkout's root,
// in the control plane's namespace, the lane's tools and registry (Cluster.run). out receives its
// output.
func docsScript(ctx context.Context, t *testing.T, c *Cluster, script string, out *strings.Builder) error {
	t.Helper()
	return c.run(ctx, t, c.p.root, laneScript(t, c, script), out)
}

func tailString(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// installOverlay is the install overlay docs/deploy.md's install steps write into the checkout.
const installOverlay = "my-cluster/install"

// liveConfig is the ConfigMap the agent's DaemonSet mounts now (its name carries a content hash).
func liveConfig(t *testing.T, c *Cluster) *corev1.ConfigMap {
	t.Helper()
	ctx := t.Context()
	ds, err := c.client.AppsV1().DaemonSets(agentNS).Get(ctx, "network-node-manager", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil {
			cm, err := c.client.CoreV1().ConfigMaps(agentNS).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return cm
		}
	}
	t.Fatal("the agent's DaemonSet mounts no ConfigMap")
	return nil
}

// applyConfig changes the agent's configuration as docs/deploy.md's "Changing the configuration"
// says for the mode's install: the config file edit(live file) and the components a fix needs,
// through the kustomize overlay (applyOverlayConfig) or Helm's values (helmConfig). Either is a new
// ConfigMap (a new content hash) and so a rollout of the DaemonSet, node by node, sampled like an
// upgrade; it returns what the apply printed.
func applyConfig(t *testing.T, c *Cluster, edit func(string) string, components ...string) string {
	t.Helper()
	var out string
	r := sampled(t, c, fmt.Sprintf("a configuration change (%s)", map[bool]string{true: "helm upgrade --reuse-values", false: "kubectl apply -k of the overlay"}[c.helm]), func() error {
		if c.helm {
			out = helmConfig(t, c, edit, components...)
		} else {
			out = applyOverlayConfig(t, c, edit, components...)
		}
		_, err := c.Kubectl(t.Context(), "", "-n", agentNS, "rollout", "status", "daemonset/network-node-manager", "--timeout=10m")
		return err
	})
	c.rollouts = append(c.rollouts, r)
	return out
}

// applyOverlayConfig: the ConfigMap as a patch in the install overlay (its config.yaml: the live
// file with edit applied), the components a fix needs added under the overlay's components: (as
// "For an optional part" in Install says), then `kubectl apply -k` of the overlay. The ConfigMap
// gets a new name and the DaemonSet a new pod template: both are in what kubectl says it changed.
func applyOverlayConfig(t *testing.T, c *Cluster, edit func(string) string, components ...string) string {
	t.Helper()
	ctx := t.Context()
	f := liveConfig(t, c).Data["config.yaml"]
	if !strings.Contains(f, "\nfixes:\n") {
		t.Fatalf("the ConfigMap's file has no top-level fixes: block:\n%s", f)
	}
	patch, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]string{"name": configMapName, "namespace": agentNS},
		"data":     map[string]string{"config.yaml": edit(f)},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(c.p.root, installOverlay)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), patch, 0o644); err != nil {
		t.Fatal(err)
	}
	kpath := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(kpath)
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("%s: %v", kpath, err)
	}
	comps, _ := k["components"].([]any)
	for _, want := range components {
		if !slices.Contains(comps, any("../../deploy/components/"+want)) {
			comps = append(comps, "../../deploy/components/"+want)
		}
	}
	k["components"] = comps
	k["patches"] = []any{map[string]any{"path": "config.yaml"}}
	if data, err = yaml.Marshal(k); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kpath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := c.Kubectl(ctx, c.p.root, "apply", "-k", installOverlay)
	if err != nil {
		t.Fatalf("kubectl apply -k %s (a ConfigMap patch, components %v): %v:\n%s", installOverlay, components, err, out)
	}
	if !regexp.MustCompile(`configmap/`+configMapName+`-\w{10} created`).MatchString(out) || !strings.Contains(out, "daemonset.apps/network-node-manager configured") {
		t.Errorf("the apply should create a ConfigMap of a new name and change the DaemonSet's pod template:\n%s", out)
	}
	return out
}

// helmConfig: `helm upgrade --reuse-values` of this commit's chart with the edited file as the
// config value and the components' values set.
func helmConfig(t *testing.T, c *Cluster, edit func(string) string, components ...string) string {
	t.Helper()
	var file map[string]any
	if err := yaml.Unmarshal([]byte(edit(liveConfig(t, c).Data["config.yaml"])), &file); err != nil {
		t.Fatal(err)
	}
	comps := map[string]any{}
	for _, dir := range components {
		i := slices.IndexFunc(manifests.ChartComponents, func(cc manifests.ChartComponent) bool { return cc.Dir == dir })
		if i < 0 {
			t.Fatalf("no chart value for components/%s", dir)
		}
		comps[manifests.ChartComponents[i].Value] = true
	}
	values, err := yaml.Marshal(map[string]any{"config": file, "components": comps})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nnm-helm-values-") // helm splits --values at commas, which t.TempDir() may hold
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	vf := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(vf, values, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = c.run(t.Context(), t, c.p.root, "helm upgrade network-node-manager "+currentBundle(t, c).chart()+" --namespace kube-system --reuse-values --values "+vf+"\n", &out)
	if err != nil {
		t.Fatalf("helm upgrade (config, components %v): %v:\n%s", components, err, out.String())
	}
	return out.String()
}
