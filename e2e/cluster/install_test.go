package cluster

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
