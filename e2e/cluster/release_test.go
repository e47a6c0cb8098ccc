package cluster

// The release as an operator gets it (issue #59): the bundle `make release` writes, pushed with its
// signature and SBOM attestations to a real OCI registry over TLS on the nodes' network (the pinned
// CNCF Distribution, bin/registry), verified with docs/deploy.md's `cosign verify --key …`, and
// pulled by the kubelets (containerd trusts the lane's CA; nothing imports the agent's image). The
// agent is installed as the previous release (hack/version.sh --previous, built from a worktree of
// the commit that wrote its CHANGELOG.md heading), then upgraded to this commit's release with
// kustomize in one kube-proxy mode and Helm in the other, with the rules sampled every 100 ms on
// every node; then rolled back and forward again, sampled too.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// helmModeEnv names the kube-proxy mode whose cluster installs with Helm (the other installs with
// kustomize). Day 2 uses the kustomize overlay and runs in the other mode.
const helmModeEnv = "NNM_CLUSTER_HELM_MODE"

func helmMode() string {
	if m := os.Getenv(helmModeEnv); m != "" {
		return m
	}
	return "nftables"
}

// ---- the registry ----

const registryPort = 5000

// laneRegistry is the OCI registry on the bridge: its address as the nodes and the docs' commands
// name it, and the CA the nodes' containerd and the lane's clients trust.
type laneRegistry struct {
	addr   string // 192.168.100.1:5000
	caFile string
	dir    string
	log    string
}

// newLaneRegistry writes a CA and the registry's certificate (its IP address as the SAN); the
// nodes' containerd is configured with the CA at boot (hack/cluster/node.sh), the server starts
// once the bridge exists (start).
func newLaneRegistry(t *testing.T) *laneRegistry {
	t.Helper()
	r := &laneRegistry{addr: fmt.Sprintf("%s:%d", gatewayIP, registryPort), dir: t.TempDir()}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "network-node-manager cluster lane CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: gatewayIP},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP(gatewayIP)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(r.dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	r.caFile = write("ca.crt", "CERTIFICATE", caDER)
	crt := write("registry.crt", "CERTIFICATE", leafDER)
	k := write("registry.key", "EC PRIVATE KEY", keyDER)
	r.log = filepath.Join(r.dir, "registry.log")
	config := fmt.Sprintf(`version: 0.1
log: {level: info, formatter: text}
storage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}
http: {addr: "%s", tls: {certificate: %s, key: %s}}
`, filepath.Join(r.dir, "data"), r.addr, crt, k)
	if err := os.WriteFile(filepath.Join(r.dir, "config.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

// start runs the registry in the control plane's namespace, on the bridge's address, until t ends.
func (r *laneRegistry) start(t *testing.T, c *Cluster) {
	t.Helper()
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := netns.Command(context.Background(), c.cp.Netns(), filepath.Join(c.p.bin, "registry"), "serve", filepath.Join(r.dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the registry: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(r.caFile)
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:     netns.DialContext(netns.Path(c.cp.Netns()), nil),
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	took := agenttest.Eventually(t, time.Minute, func() error {
		resp, err := client.Get("https://" + r.addr + "/v2/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		return nil
	})
	t.Logf("registry (CNCF Distribution, bin/registry) serving https://%s/v2/ in the control plane's namespace after %v; its CA is the nodes' containerd's", r.addr, took.Round(100*time.Millisecond))
}

// pulls counts the registry's answers to the nodes (by address) for the agent's image (its access
// log is the combined log format: the client's address without its port): manifests
// and blobs GETs, as its access log records them.
func (r *laneRegistry) pulls(t *testing.T) map[string]int {
	t.Helper()
	data, err := os.ReadFile(r.log)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) - - \[[^]]*\] "GET /v2/network-node-manager/(manifests|blobs)/`)
	n := map[string]int{}
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		n[m[1]+" "+m[2]]++
	}
	return n
}

// ---- the docs' blocks, run in the control plane's namespace ----

const (
	bundleMarker       = "<!-- bundle-steps -->"
	helmInstallMarker  = "<!-- helm-install-steps -->"
	helmAdoptMarker    = "<!-- helm-adopt-steps -->"
	helmUninstallMaker = "<!-- helm-uninstall-steps -->"
	docsRegistry       = "REGISTRY=registry.example.com"
)

// laneScript turns docs/deploy.md blocks into the lane's script: the registry is the lane's.
func laneScript(t *testing.T, c *Cluster, script string) string {
	t.Helper()
	if !strings.Contains(script, docsRegistry) {
		return script
	}
	return strings.ReplaceAll(script, docsRegistry, "REGISTRY="+c.registry.addr)
}

// releasePreamble sets what the bundle block sets, for blocks run after it in another shell.
func releasePreamble(c *Cluster, b *bundle) string {
	return fmt.Sprintf("VERSION=%s\nBUNDLE=%s\nREGISTRY=%s\n", b.version, b.dir, c.registry.addr)
}

// ---- bundles ----

// bundle is a release bundle (make release) and the source it was built from.
type bundle struct {
	version, commit, dir, src, digest string
}

func (b *bundle) chart() string {
	return filepath.Join(b.dir, "network-node-manager-"+strings.TrimPrefix(b.version, "v")+".tgz")
}

func (b *bundle) hasChart() bool {
	_, err := os.Stat(b.chart())
	return err == nil
}

// previousRelease is the bundle `make cluster` built of hack/version.sh --previous
// (hack/cluster/previous-release.sh): the release an upgrade of this commit starts from.
func previousRelease(t *testing.T, c *Cluster) *bundle {
	t.Helper()
	e := readEnv(t, filepath.Join(c.p.imagesDir, "previous.env"), "NNM_PREVIOUS_VERSION", "NNM_PREVIOUS_COMMIT", "NNM_PREVIOUS_BUNDLE", "NNM_PREVIOUS_SOURCE")
	out, err := exec.Command(filepath.Join(c.p.root, "hack/version.sh"), "--previous").Output()
	if err != nil {
		t.Fatalf("hack/version.sh --previous: %v", err)
	}
	want := strings.Fields(string(out))
	if len(want) != 2 || want[0] != e["NNM_PREVIOUS_VERSION"] || want[1] != e["NNM_PREVIOUS_COMMIT"] {
		netns.Unavailable(t, "hack/version.sh --previous says %q, bin/cluster-images/previous.env holds %s %s: run `make cluster` again", strings.TrimSpace(string(out)), e["NNM_PREVIOUS_VERSION"], e["NNM_PREVIOUS_COMMIT"])
	}
	b := &bundle{version: e["NNM_PREVIOUS_VERSION"], commit: e["NNM_PREVIOUS_COMMIT"], dir: e["NNM_PREVIOUS_BUNDLE"], src: e["NNM_PREVIOUS_SOURCE"]}
	digest, err := os.ReadFile(filepath.Join(b.dir, "image.digest"))
	if err != nil {
		netns.Unavailable(t, "the previous release's bundle: %v: run `make cluster`", err)
	}
	b.digest = strings.TrimSpace(string(digest))
	return b
}

// run runs script with bash -e in the control plane's namespace (where the registry's address is
// the bridge's), from dir, with the lane's kubectl, cosign and helm (bin/) first on the PATH, the
// lane's CA trusted (SSL_CERT_FILE), ARCHES=amd64 (the nodes' architecture).
func (c *Cluster) run(ctx context.Context, t *testing.T, dir, script string, out *strings.Builder) error {
	t.Helper()
	cmd := netns.Command(ctx, c.cp.Netns(), "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PATH="+c.p.bin+":"+os.Getenv("PATH"), "KUBECONFIG="+c.kubeconfig, "ARCHES=amd64", "SSL_CERT_FILE="+c.registry.caFile,
		"HELM_CACHE_HOME="+filepath.Join(c.registry.dir, "helm"), "HELM_CONFIG_HOME="+filepath.Join(c.registry.dir, "helm"),
		"HELM_DATA_HOME="+filepath.Join(c.registry.dir, "helm"))
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}

// pushBundle pushes a bundle's image with its signature and attestations to the lane's registry
// and verifies them there, with the commands of docs/deploy.md's bundle steps.
func pushBundle(t *testing.T, c *Cluster, b *bundle) {
	t.Helper()
	script := strings.Join(bundleCommands(t, c, true), "\n")
	var out strings.Builder
	err := c.run(t.Context(), t, c.p.root, releasePreamble(c, b)+script, &out)
	t.Logf("the release %s's bundle pushed to %s and verified (docs/deploy.md's commands):\n%s", b.version, c.registry.addr, tailString(out.String(), 30))
	if err != nil {
		t.Fatalf("push and verify %s: %v", b.version, err)
	}
}

// bundleCommands is the docs' bundle block less its first lines (the build and the variables), for
// a bundle that exists: check, push, verify.
func bundleCommands(t *testing.T, c *Cluster, existing bool) []string {
	t.Helper()
	var cmds []string
	for _, l := range strings.Split(laneScript(t, c, docBlock(t, c.p.root, bundleMarker)), "\n") {
		if existing && (strings.HasPrefix(l, "make release") || strings.HasPrefix(l, "VERSION=") || strings.HasPrefix(l, "BUNDLE=")) {
			continue
		}
		cmds = append(cmds, l)
	}
	return cmds
}

// ---- installs ----

// installPrevious installs the previous release as its own manifests say (its deploy/base, the
// image by the lane's registry, its tag and digest), or with its chart in the Helm mode when it has
// one; it returns how long from the apply until every agent was Ready.
func installPrevious(t *testing.T, c *Cluster, prev *bundle) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	var script string
	if c.helm && prev.hasChart() {
		script = fmt.Sprintf("helm install network-node-manager %s --namespace kube-system --set image.registry=%s\n", prev.chart(), c.registry.addr)
	} else {
		overlay := filepath.Join(prev.src, "my-cluster", "install")
		if err := os.MkdirAll(overlay, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(filepath.Dir(overlay)) })
		k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../deploy/base
images:
  - name: network-node-manager
    newName: %s/network-node-manager
    newTag: %s
    digest: %s
`, c.registry.addr, prev.version, prev.digest)
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		script = "kubectl apply -k my-cluster/install\n"
	}
	script += "echo '== applied'\nkubectl -n kube-system rollout status daemonset/network-node-manager --timeout=10m\n"
	var out strings.Builder
	start := time.Now()
	err := c.run(ctx, t, prev.src, script, &out)
	took := time.Since(start)
	t.Logf("the previous release %s (commit %.12s) installed (%s) in %v, every agent Ready:\n%s", prev.version, prev.commit, map[bool]string{true: "Helm", false: "its deploy/base"}[c.helm && prev.hasChart()], took.Round(100*time.Millisecond), tailString(out.String(), 20))
	if err != nil {
		t.Fatalf("install %s: %v", prev.version, err)
	}
	checkAgentImages(t, c, prev)
	return took
}

// checkAgentImages: every agent Pod runs b's image by digest and says so.
func checkAgentImages(t *testing.T, c *Cluster, b *bundle) {
	t.Helper()
	pods := agentPods(t, c)
	if len(pods) != len(c.nodes) {
		t.Errorf("%d agent Pods, want one per node (%d)", len(pods), len(c.nodes))
	}
	for _, pod := range pods {
		want := c.registry.addr + "/network-node-manager:" + b.version + "@" + b.digest
		if got := pod.Spec.Containers[0].Image; got != want {
			t.Errorf("agent %s on %s runs %s, want %s", pod.Name, pod.Spec.NodeName, got, want)
		}
		for _, st := range pod.Status.ContainerStatuses {
			if !strings.HasSuffix(st.ImageID, b.digest) && !strings.Contains(st.ImageID, "@") {
				t.Errorf("agent %s: the kubelet reports image ID %s", pod.Name, st.ImageID)
			}
		}
	}
}

// rollout is one sampled change of the DaemonSet: what ran it, how long it took and what the
// samplers saw.
type rollout struct {
	what    string
	took    time.Duration
	summary map[string]string // node → the sampler's summary
	perNode map[string]time.Duration
}

// sampled runs change (which returns when the rollout is complete) with the sampler on every node
// in its fixes mode (the releases write their rules differently) and returns what they saw; a
// sample lacking a fix's rules fails t.
func sampled(t *testing.T, c *Cluster, what string, change func() error) rollout {
	t.Helper()
	return sampledExcept(t, c, what, nil, change)
}

// rollbackGaps: per previous release, the fixes whose iptables rules it writes in another table than
// this commit does, so that a rollback to it may leave them absent for a moment. v0.1.0 wrote
// invalid-drop in filter (this commit: mangle), and its restore deletes this commit's mangle chain
// and adds its own filter chain in two iptables-nft commits, one per table, mangle first: a sample
// can fall between them. The upgrade to this commit adds mangle's before it deletes filter's, in the
// same order, and is sampled without exception.
var rollbackGaps = map[string][]string{"v0.1.0": {"invalid-drop"}}

// sampledExcept is sampled, where samples lacking only the rules of the fixes in explained are
// logged instead of failing t (as long as the sampler listed every lacking sample: at most 5).
func sampledExcept(t *testing.T, c *Cluster, what string, explained []string, change func() error) rollout {
	t.Helper()
	ctx := t.Context()
	r := rollout{what: what, summary: map[string]string{}, perNode: map[string]time.Duration{}}
	for _, n := range c.nodes {
		env, err := samplerEnv(ctx, c, n.name)
		if err != nil {
			t.Fatal(err)
		}
		baseline, err := startSampler(ctx, c, n, env+" NNM_SAMPLER_MODE=fixes")
		if err != nil {
			t.Fatalf("%s: sampler: %v: %s", n.name, err, baseline)
		}
	}
	before := map[string]string{}
	for _, p := range agentPods(t, c) {
		before[p.Spec.NodeName] = p.Name
	}
	start := time.Now()
	err := change()
	r.took = time.Since(start)
	time.Sleep(3 * time.Second) // a moment after the last new pod turned Ready
	for _, n := range c.nodes {
		sum, serr := stopSampler(ctx, c, n)
		if serr != nil {
			t.Errorf("%s: sampler: %v", n.name, serr)
			continue
		}
		r.summary[n.name] = strings.TrimSpace(sum)
		switch {
		case strings.Contains(sum, "lacking=0 ") && !strings.Contains(sum, "samples=0 "):
		case lackingOnly(sum, explained):
			t.Logf("%s: during %s samples lacked only the rules of %s, which the release rolled back to writes in another table (rollbackGaps):\n%s", n.name, what, strings.Join(explained, ", "), sum)
		default:
			t.Errorf("%s: during %s a sample lacked a fix's rules (or none was taken):\n%s", n.name, what, sum)
		}
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	// Per node: from the new Pod's creation (the old one deleted) to Ready.
	for _, p := range agentPods(t, c) {
		if before[p.Spec.NodeName] == p.Name {
			t.Errorf("%s: the agent on %s was not replaced (%s)", what, p.Spec.NodeName, p.Name)
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				r.perNode[p.Spec.NodeName] = cond.LastTransitionTime.Sub(p.CreationTimestamp.Time)
			}
		}
	}
	t.Logf("%s: %v until every agent was Ready; per node, new Pod created → Ready: %v", what, r.took.Round(100*time.Millisecond), r.perNode)
	for _, n := range c.nodes {
		t.Logf("%s: %s: the agent's rules, sampled every 100 ms through it: %s", what, n.name, r.summary[n.name])
	}
	return r
}

// lackingOnly: the sampler's summary (with its list of lacking samples) has samples, at most 5
// lacking ones, and each of those lacks only the rules of fixes in explained.
func lackingOnly(sum string, explained []string) bool {
	m := regexp.MustCompile(`samples=(\d+) lacking=(\d+) `).FindStringSubmatch(sum)
	if len(explained) == 0 || m == nil || m[1] == "0" || len(m[2]) > 1 || m[2] > "5" {
		return false
	}
	unit := regexp.MustCompile(`^\S+: the rules of (\S+)$`)
	for _, l := range strings.Split(sum, "\n") {
		switch {
		case strings.HasPrefix(l, "@ ") && !strings.HasSuffix(l, " ms:"):
			return false // a sample that failed
		case unit.MatchString(l) && !slices.Contains(explained, unit.FindStringSubmatch(l)[1]):
			return false
		}
	}
	return true
}

// upgradeFromPrevious upgrades to this commit's release as docs/deploy.md says: its bundle steps
// (make release, checksums, signature, push, cosign verify), then the kustomize install steps or
// (Helm mode) the steps that hand a kustomize install to Helm and the Helm install, with a
// connection held from client-a across it. It returns this commit's bundle.
func upgradeFromPrevious(t *testing.T, c *Cluster, prev *bundle) *bundle {
	t.Helper()
	ctx := t.Context()
	svc, err := c.client.CoreV1().Services(testNS).Get(ctx, "lb-local", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hold := startHold(t, c, fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, servicePort))
	nodeA := c.node("node-a")
	idBefore, err := conntrackID(ctx, c, nodeA, hold.from)
	if err != nil {
		t.Error(err)
	}
	script := laneScript(t, c, docBlock(t, c.p.root, bundleMarker)) + "\necho '== pushed'\n"
	how := "kustomize (docs/deploy.md's install steps)"
	if c.helm {
		if !prev.hasChart() {
			// The steps end with their own Helm install (client-side: the objects were kubectl apply's).
			script += docBlock(t, c.p.root, helmAdoptMarker) + "\n"
			how = "Helm (docs/deploy.md's steps from a kustomize install to Helm)"
		} else {
			script += docBlock(t, c.p.root, helmInstallMarker) + "\n"
			how = "Helm (docs/deploy.md's Helm install, an upgrade of the previous release's)"
		}
	} else {
		script += installSteps(t, c.p.root) + "\n"
		for _, d := range regexp.MustCompile(`mkdir -p (\S+)`).FindAllStringSubmatch(script, -1) {
			top := filepath.Join(c.p.root, strings.SplitN(d[1], "/", 2)[0])
			if _, err := os.Stat(top); err == nil {
				t.Fatalf("%s exists before the install steps ran: remove it", top)
			}
			t.Cleanup(func() { os.RemoveAll(top) })
		}
	}
	var out strings.Builder
	r := sampled(t, c, "the upgrade "+prev.version+" → this commit's release with "+how, func() error {
		ctx, cancel := context.WithTimeout(ctx, 25*time.Minute)
		defer cancel()
		if err := c.run(ctx, t, c.p.root, script, &out); err != nil {
			return fmt.Errorf("%w; the steps' last lines:\n%s", err, tailString(out.String(), 40))
		}
		return nil
	})
	t.Logf("the upgrade's steps:\n%s", tailString(out.String(), 60))
	if m := regexp.MustCompile(`(?s)cosign verify .*?\n(\[\{.*?\}\])`).FindStringSubmatch(out.String()); m != nil {
		t.Logf("cosign verify's output in the lane:\n%s", m[1])
	}
	line, holdErr := hold.stop()
	t.Logf("client-a's connection held across the upgrade: %s", line)
	if holdErr != nil {
		t.Errorf("the connection held across the upgrade failed: %v: %s", holdErr, hold.output())
	}
	if idBefore != "" {
		switch idAfter, err := conntrackID(ctx, c, nodeA, hold.from); {
		case err != nil:
			t.Errorf("after the upgrade: %v", err)
		case strings.Fields(idAfter)[0] != strings.Fields(idBefore)[0]:
			t.Errorf("node-a's conntrack entry of the held connection changed: before id=%s, after id=%s", idBefore, idAfter)
		default:
			t.Logf("node-a's conntrack entry of the held connection: id=%s before and after (the same entry)", idAfter)
		}
	}
	cur := currentBundle(t, c)
	checkAgentImages(t, c, cur)
	c.rollouts = append(c.rollouts, r)
	return cur
}

// currentBundle is the bundle the docs' steps built of this checkout.
func currentBundle(t *testing.T, c *Cluster) *bundle {
	t.Helper()
	out, err := exec.Command(filepath.Join(c.p.root, "hack/version.sh")).Output()
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(out))
	b := &bundle{version: v, dir: filepath.Join(c.p.bin, "release", v), src: c.p.root}
	digest, err := os.ReadFile(filepath.Join(b.dir, "image.digest"))
	if err != nil {
		t.Fatalf("this commit's bundle: %v", err)
	}
	b.digest = strings.TrimSpace(string(digest))
	return b
}

// rollbackAndForward rolls the agent back to the previous release (kubectl rollout undo; helm
// rollback when Helm installed both) and forward again, both sampled.
func rollbackAndForward(t *testing.T, c *Cluster, prev, cur *bundle) {
	t.Helper()
	helmBoth := c.helm && prev.hasChart()
	back, forward := "kubectl -n kube-system rollout undo daemonset/network-node-manager",
		"kubectl -n kube-system rollout undo daemonset/network-node-manager"
	if helmBoth {
		back, forward = "helm rollback network-node-manager 1 --namespace kube-system", "helm rollback network-node-manager 2 --namespace kube-system"
	}
	for _, step := range []struct {
		cmd string
		to  *bundle
	}{{back, prev}, {forward, cur}} {
		var out strings.Builder
		var explained []string
		if step.to == prev {
			explained = rollbackGaps[prev.version]
		}
		r := sampledExcept(t, c, fmt.Sprintf("`%s` (to %s)", step.cmd, step.to.version), explained, func() error {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
			defer cancel()
			return c.run(ctx, t, c.p.root, step.cmd+"\nkubectl -n kube-system rollout status daemonset/network-node-manager --timeout=10m\n", &out)
		})
		t.Logf("%s:\n%s", step.cmd, tailString(out.String(), 8))
		checkAgentImages(t, c, step.to)
		c.rollouts = append(c.rollouts, r)
	}
}

// helmUninstall runs docs/deploy.md's Helm uninstall block and compares each node's netfilter state
// with the one before the install (the kustomize mode's is day 2's last stage).
func helmUninstall(t *testing.T, c *Cluster, cur *bundle, before map[string][]string) {
	t.Helper()
	var out strings.Builder
	start := time.Now()
	err := c.run(t.Context(), t, c.p.root, releasePreamble(c, cur)+laneScript(t, c, docBlock(t, c.p.root, helmUninstallMaker)), &out)
	t.Logf("docs/deploy.md's Helm uninstall steps took %v:\n%s", time.Since(start).Round(time.Second), tailString(out.String(), 30))
	if err != nil {
		t.Fatalf("docs/deploy.md's Helm uninstall steps: %v", err)
	}
	compareAfterUninstall(t, c, before)
}

// releaseReport logs the lane's release figures in one place: the registry's pulls by node, every
// sampled rollout.
func releaseReport(t *testing.T, c *Cluster) {
	t.Helper()
	pulls := c.registry.pulls(t)
	keys := make([]string, 0, len(pulls))
	for k := range pulls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s GETs from %s\n", strings.Fields(k)[1], strings.Fields(k)[0])
	}
	t.Logf("the registry's access log: the agent's image requested by the nodes:\n%s", b.String())
	for _, n := range c.nodes {
		if pulls[n.ip+" manifests"] == 0 || pulls[n.ip+" blobs"] == 0 {
			t.Errorf("%s (%s) pulled no manifest or no blob of the agent's image from the registry", n.name, n.ip)
		}
	}
	for _, r := range c.rollouts {
		t.Logf("rollout %s: %v; per node %v", r.what, r.took.Round(100*time.Millisecond), r.perNode)
	}
}

// TestLackingOnly: the rollback's explained gap is told from any other lacking sample.
func TestLackingOnly(t *testing.T) {
	gap := "samples=646 lacking=1 over_ms=70402 interval_ms median=100 p99=317 max=752 sample_ms median=31.0 max=737.0 longest_absence_ms=202\n" +
		"  ip: 9 lines, lacking in 1 samples, longest_absence_ms=202, fixes invalid-drop ipvs-externalip-dnat\n" +
		"  ip6: 7 lines, lacking in 0 samples, longest_absence_ms=0, fixes invalid-drop ipvs-externalip-dnat\n" +
		"@ 60303 ms:\nip: the rules of invalid-drop\n"
	for _, tc := range []struct {
		sum       string
		explained []string
		want      bool
	}{
		{gap, []string{"invalid-drop"}, true},
		{gap, nil, false},
		{strings.Replace(gap, "of invalid-drop", "of ipvs-externalip-dnat", 1), []string{"invalid-drop"}, false},
		{gap + "@ 60403 ms:\nip: the rules of invalid-drop\nip6: the rules of ipvs-externalip-dnat\n", []string{"invalid-drop"}, false},
		{strings.Replace(gap, "@ 60303 ms:\n", "@ 60303 ms: netlink: dump interrupted\n", 1), []string{"invalid-drop"}, false},
		{strings.Replace(gap, "lacking=1 ", "lacking=6 ", 1), []string{"invalid-drop"}, false},
		{strings.Replace(gap, "samples=646 ", "samples=0 ", 1), []string{"invalid-drop"}, false},
	} {
		if got := lackingOnly(tc.sum, tc.explained); got != tc.want {
			t.Errorf("lackingOnly(%q, %v) = %v, want %v", tc.sum, tc.explained, got, tc.want)
		}
	}
}
