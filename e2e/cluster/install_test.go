package cluster

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The install as docs/deploy.md gives it: the shell block after "<!-- install-steps -->" in its
// "## Install" section, run for real with bash -e from the root of this checkout (as the doc says),
// with ARCHES=amd64 (the doc's knob for one architecture: the nodes are amd64) and the lane's
// kubectl. The one command that cannot run here is the push to "your registry": the lane's buildah
// (hack/cluster/docshims/buildah) hands the pushed image to the nodes' containerd under the pushed
// name instead. So the image the doc builds, under the tag the doc pushes, is what the overlay the
// doc writes runs, or the rollout fails (ImagePullBackOff: no registry answers).

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

// installSteps returns the doc's install script.
func installSteps(t *testing.T, root string) string { return docBlock(t, root, installMarker) }

// docsScript runs script as the doc's blocks run: bash -e in the checkout's root, the lane's kubectl
// and buildah (hack/cluster/docshims/buildah) first on the PATH, ARCHES=amd64. out receives its
// output.
func docsScript(ctx context.Context, t *testing.T, c *Cluster, script string, out io.Writer) error {
	t.Helper()
	realBuildah, err := exec.LookPath("buildah")
	if err != nil {
		t.Fatalf("buildah: %v (make test-cluster installs it)", err)
	}
	shims := t.TempDir()
	for name, target := range map[string]string{
		"buildah": filepath.Join(c.p.root, "hack/cluster/docshims/buildah"),
		"kubectl": filepath.Join(c.p.bin, "kubectl"),
	} {
		if err := os.Symlink(target, filepath.Join(shims, name)); err != nil {
			t.Fatal(err)
		}
	}
	var dirs []string
	for _, n := range c.nodes {
		dirs = append(dirs, n.dir)
	}
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = c.p.root
	cmd.Env = append(os.Environ(),
		"PATH="+shims+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig, "ARCHES=amd64",
		"NNM_CLUSTER_REAL_BUILDAH="+realBuildah, "NNM_CLUSTER_PUSH_DIR="+t.TempDir(),
		"NNM_CLUSTER_NODE_DIRS="+strings.Join(dirs, " "))
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

// installFromDocs runs the doc's install steps and returns how long from the first `kubectl apply`
// until `kubectl rollout status` said every agent is Ready.
func installFromDocs(t *testing.T, c *Cluster) time.Duration {
	t.Helper()
	script := installSteps(t, c.p.root)
	if !strings.Contains(script, "kubectl apply -k") || !strings.Contains(script, "rollout status daemonset/network-node-manager") {
		t.Fatalf("docs/deploy.md's install steps no longer apply and wait for the DaemonSet; teach e2e/cluster:\n%s", script)
	}
	// The doc writes its overlay (my-cluster/) into the checkout; it is not the repository's.
	for _, d := range regexp.MustCompile(`mkdir -p (\S+)`).FindAllStringSubmatch(script, -1) {
		top := filepath.Join(c.p.root, strings.SplitN(d[1], "/", 2)[0])
		if _, err := os.Stat(top); err == nil {
			t.Fatalf("%s exists before the install steps ran: remove it", top)
		}
		t.Cleanup(func() { os.RemoveAll(top) })
	}
	// Time the steps from the apply on: kubectl prints "… created" for it, the rest is make release.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	applied := make(chan time.Time, 1)
	out := &stampWriter{mark: "daemonset.apps/network-node-manager", at: applied}
	start := time.Now()
	err := docsScript(ctx, t, c, script, out)
	t.Logf("docs/deploy.md install steps (bash -e, ARCHES=amd64, in the checkout's root) took %v:\n%s", time.Since(start).Round(time.Second), tailString(out.String(), 40))
	if err != nil {
		t.Fatalf("docs/deploy.md's install steps failed: %v", err)
	}
	var from time.Time
	select {
	case from = <-applied:
	default:
		t.Fatalf("`kubectl apply -k` printed no daemonset.apps/network-node-manager line")
	}
	took := time.Since(from)
	t.Logf("from `kubectl apply -k` (the DaemonSet created) to the rollout complete (every agent Ready): %v", took.Round(100*time.Millisecond))
	return took
}

// stampWriter keeps what is written and sends the time the first line containing mark arrived.
type stampWriter struct {
	strings.Builder
	mark string
	at   chan time.Time
	sent bool
}

func (w *stampWriter) Write(p []byte) (int, error) {
	w.Builder.Write(p)
	if !w.sent && strings.Contains(w.String(), w.mark) {
		w.sent = true
		w.at <- time.Now()
	}
	return len(p), nil
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

// applyOverlayConfig changes the agent's configuration as docs/deploy.md's "Changing the
// configuration" says: the ConfigMap as a patch in the install overlay (its config.yaml: the live
// file with edit applied), the components a fix needs added under the overlay's components: (as
// "For an optional part" in Install says), then `kubectl apply -k` of the overlay; the kubelets are
// made to refresh the ConfigMap volume at once. It returns kubectl's output. The upgrade's apply
// keeps all of it: it is the overlay's.
func applyOverlayConfig(t *testing.T, c *Cluster, edit func(string) string, components ...string) string {
	t.Helper()
	ctx := t.Context()
	cm, err := c.client.CoreV1().ConfigMaps(agentNS).Get(ctx, configMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := cm.Data["config.yaml"]
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
		if !slices.Contains(comps, any(want)) {
			comps = append(comps, want)
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
	if !strings.Contains(out, "configmap/"+configMapName+" configured") || strings.Contains(out, "daemonset.apps/network-node-manager configured") {
		t.Errorf("the apply should change the ConfigMap and nothing of the DaemonSet:\n%s", out)
	}
	if err := kickKubelet(ctx, c); err != nil {
		t.Error(err)
	}
	return out
}
