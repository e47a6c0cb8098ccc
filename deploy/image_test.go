package deploy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackliberal"
	"github.com/network-node-manager/network-node-manager/internal/events"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// The image built by hack/image.sh (make image), run the way deploy/base's DaemonSet runs it, without a
// container runtime (none runs here): its root filesystem read-only (an overlay over the image, made
// read-only after the mount points are created, as runc does), /proc with /proc/sys read-only and /sys
// read-only (what containerd gives an unprivileged container), the DaemonSet's volumes at its mount
// paths, its service account token and in-cluster API variables, its env and args, uid 0 with only
// the capabilities the manifest adds (setpriv: bounding, inheritable and ambient sets; no_new_privs for
// allowPrivilegeEscalation: false), in a node network namespace wired to the local API server. Not
// emulated: the seccomp RuntimeDefault profile, cgroup limits, a PID namespace.
//
// The agent must become ready, program both backends (one run each) and conntrack-liberal's sysctl,
// and serve its protected metrics. Then deploy/uninstall's cleanup container, run the same way on the
// same node, must remove the rules and write the sysctl's previous value back.

const imageRef = "network-node-manager:latest"

// imageTestEnv gates the test: `make test-image` builds the image and sets it. Building the image takes
// minutes (debootstrap, then a 146 MB commit), beyond what `make test` may spend, so `make test` skips it.
const imageTestEnv = "NNM_TEST_IMAGE"

func TestImageRunsAsTheDaemonSet(t *testing.T) {
	if os.Getenv(imageTestEnv) != "1" {
		t.Skipf("set %s=1 (make test-image builds the image and runs this test)", imageTestEnv)
	}
	if _, err := exec.LookPath("buildah"); err != nil {
		netns.Unavailable(t, "buildah missing: make image (installs buildah and debootstrap)")
	}
	if out, err := exec.Command("buildah", "inspect", "--type", "image", imageRef).CombinedOutput(); err != nil {
		netns.Unavailable(t, "image %s not built (make image): %v: %s", imageRef, err, out)
	}
	netns.Require(t, "iptables-save", "nft", "setpriv", "unshare", "chroot")
	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	a, err := agenttest.NewApplier(cp.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, "overlays/podmonitor")
	for _, o := range objs {
		if o.u.GetKind() == "PodMonitor" || o.u.GetKind() == "DaemonSet" {
			continue
		}
		if err := a.Apply(ctx, o.u, false); err != nil {
			t.Fatalf("apply %s: %v", o, err)
		}
	}
	// The DaemonSet with conntrack-liberal's writable /proc/sys/net: the test enables that fix.
	ds := typed[appsv1.DaemonSet](t, find(t, render(t, "overlays/conntrack-liberal"), "DaemonSet", "network-node-manager"))
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "network-node-manager"))

	// The image's root filesystem, from buildah's storage.
	ctr := strings.TrimSpace(run(t, "buildah", "from", "--pull-never", imageRef))
	t.Cleanup(func() { _ = exec.Command("buildah", "rm", ctr).Run() })
	rootfs := strings.TrimSpace(run(t, "buildah", "mount", ctr))
	var img struct {
		OCIv1 struct {
			Config struct {
				Entrypoint []string
				Cmd        []string
				User       string
			} `json:"config"`
		}
	}
	if err := json.Unmarshal([]byte(run(t, "buildah", "inspect", "--type", "image", imageRef)), &img); err != nil {
		t.Fatal(err)
	}
	if len(img.OCIv1.Config.Entrypoint) == 0 || img.OCIv1.Config.User != "0:0" {
		t.Fatalf("image config: entrypoint %v user %q", img.OCIv1.Config.Entrypoint, img.OCIv1.Config.User)
	}

	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			runImage(t, cp, ds, cm, rootfs, img.OCIv1.Config.Entrypoint, backend)
		})
	}
	t.Run("connlabel", func(t *testing.T) { imageSavesLabels(t, rootfs) })
}

// imageSavesLabels: the image's iptables-nft-save prints a rule that sets a conntrack label bit of
// the agent's (64-127) as the agent wrote it, by number, and warns about nothing: the image has an
// /etc/xtables/connlabel.conf (deploy/image/connlabel.conf), without which it warns once per rule.
func imageSavesLabels(t *testing.T, rootfs string) {
	ns := netns.New(t, "nnm-img-cl")
	in := "*nat\n:NNM-LABEL - [0:0]\n" +
		"-A NNM-LABEL -d 203.0.113.10/32 -p tcp -m tcp --dport 80 -m connlabel --label 64 --set -j DNAT --to-destination 10.96.0.10:80\n" +
		"-A NNM-LABEL -m connlabel --label 127 -m conntrack --ctstate DNAT -j MASQUERADE\nCOMMIT\n"
	restore := ns.Command("chroot", rootfs, "iptables-nft-restore", "--noflush")
	restore.Stdin = strings.NewReader(in)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("the image's iptables-nft-restore: %v: %s", err, out)
	}
	save := ns.Command("chroot", rootfs, "iptables-nft-save", "-t", "nat")
	var stdout, stderr strings.Builder
	save.Stdout, save.Stderr = &stdout, &stderr
	if err := save.Run(); err != nil {
		t.Fatalf("the image's iptables-nft-save: %v: %s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("the image's iptables-nft-save wrote to stderr: %q", stderr.String())
	}
	for _, want := range []string{`--label "64" --set`, `--label "127" -m conntrack`} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the image's iptables-nft-save does not print %s:\n%s", want, stdout.String())
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("%s %v: %v: %s", name, args, err, ee.Stderr)
		}
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return string(out)
}

func runImage(t *testing.T, cp *controlplane.ControlPlane, ds *appsv1.DaemonSet, cm *corev1.ConfigMap, rootfs string, entrypoint []string, backend string) {
	ctx := t.Context()
	ns := netns.New(t, "nnm-img")
	nodeKC, err := cp.ConnectNamespace(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DisconnectNamespace(ns.Name) })
	nodeName := "img-" + backend
	admin := cp.AdminClient()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })

	// In-cluster API access as the kubelet gives it: KUBERNETES_SERVICE_HOST/PORT and the projected
	// token, CA and namespace of the pod's ServiceAccount.
	kc, err := clientcmd.LoadFromFile(nodeKC)
	if err != nil {
		t.Fatal(err)
	}
	var server string
	var caPEM []byte
	for _, c := range kc.Clusters {
		server, caPEM = c.Server, c.CertificateAuthorityData
	}
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	// The test API server's certificate names localhost, not the veth address the node reaches it on,
	// and in-cluster config has no TLS server name: forward localhost:6443 in the node namespace to it,
	// as node-local API proxies (kubespray's nginx-proxy, k3s) do, with the kubelet's /etc/hosts.
	forwardInNetns(t, ns, "127.0.0.1:6443", u.Host)
	u.Host = "localhost:6443"
	tr, err := admin.CoreV1().ServiceAccounts(ds.Namespace).CreateToken(ctx, ds.Spec.Template.Spec.ServiceAccountName,
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hostRoot := filepath.Join(dir, "host") // hostPath volumes live here, not on the real host
	saDir := filepath.Join(dir, "serviceaccount")
	files := map[string][]byte{
		filepath.Join(saDir, "token"): []byte(tr.Status.Token), filepath.Join(saDir, "ca.crt"): caPEM,
		filepath.Join(saDir, "namespace"): []byte(ds.Namespace),
	}
	c := ds.Spec.Template.Spec.Containers[0]

	// Environment: the manifest's (downward API resolved as the kubelet would), the in-cluster
	// variables, and what an overlay sets for this run.
	env := []string{"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port()}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env = append(env, e.Name+"="+nodeName)
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			env = append(env, fmt.Sprintf("%s=%d", e.Name, c.Resources.Limits.Memory().Value()))
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		default:
			t.Fatalf("env %s: teach this test its source", e.Name)
		}
	}
	env = append(env, "NNM_BACKEND="+backend, "NNM_PROXY_MODE=ipvs", "NNM_FIXES_CONNTRACK_LIBERAL_ENABLED=true")
	script := containerScript(t, containerRun{dir: filepath.Join(dir, "agent"), hostRoot: hostRoot, rootfs: rootfs,
		pod: ds.Spec.Template.Spec, c: c, cm: cm, files: files, env: env, entrypoint: entrypoint,
		mounts: []string{saDir + " /var/run/secrets/kubernetes.io/serviceaccount ro"}})
	// The value conntrack-liberal will replace, and the uninstall must write back.
	liberalBefore := strings.TrimSpace(ns.MustExec("cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"))
	logPath := filepath.Join(dir, "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := ns.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return fmt.Errorf("agent did not stop within 20s of SIGTERM")
		}
	}
	t.Cleanup(func() {
		_ = stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("agent log:\n%s\nmount script:\n%s", b, script)
		}
	})

	// Probes from the node namespace, on the ports the manifest names.
	port := func(name string) string {
		for _, p := range c.Ports {
			if p.Name == name {
				return fmt.Sprint(p.ContainerPort)
			}
		}
		t.Fatalf("no port %s", name)
		return ""
	}
	nsPath := ns.Path()
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: netns.DialContext(nsPath, &net.Dialer{Timeout: 2 * time.Second}),
	}}
	get := func(u, token string) (int, string, error) { return netns.Get(ctx, client, u, token) }
	start := time.Now()
	readyz := "http://127.0.0.1:" + port(c.ReadinessProbe.HTTPGet.Port.StrVal) + c.ReadinessProbe.HTTPGet.Path
	for {
		code, body, err := get(readyz, "")
		if err == nil && code == 200 {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("agent exited before ready: %v", err)
		default:
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("not ready after 60s: %d %q %v", code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s: ready %v after start", backend, time.Since(start).Round(time.Millisecond))
	livenessURL := "http://127.0.0.1:" + port(c.LivenessProbe.HTTPGet.Port.StrVal) + c.LivenessProbe.HTTPGet.Path
	if code, body, err := get(livenessURL, ""); err != nil || code != 200 {
		t.Errorf("liveness probe %s: %d %q %v", livenessURL, code, body, err)
	}

	// The kernel: the fixes' rules in the chosen backend, and the sysctl.
	switch backend {
	case "iptables":
		// invalid-drop's chains are in mangle (before any filter-table ACCEPT), ipvs-externalip-dnat's
		// in nat: every table of the whole save, not one named table, so a fix moving its chains to
		// another table does not fail this check (it failed when invalid-drop left filter).
		out := ns.MustOutput("iptables-nft-save")
		got := chainTables(out, iptables.ChainPrefix)
		for _, table := range []string{"mangle", "nat"} {
			if !slices.Contains(got, table) {
				t.Errorf("iptables-nft-save: no %s chain in the %s table (%s chains in %v):\n%s", iptables.ChainPrefix, table, iptables.ChainPrefix, got, out)
			}
		}
	case "nftables":
		out := ns.MustExec("nft", "list", "tables")
		for _, id := range []string{"invalid-drop", "ipvs-externalip-dnat"} {
			if !strings.Contains(out, nftables.TableName(id)) {
				t.Errorf("nft list tables shows no %s:\n%s", nftables.TableName(id), out)
			}
		}
	}
	if v := strings.TrimSpace(ns.MustExec("cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")); v != "1" {
		t.Errorf("nf_conntrack_tcp_be_liberal = %s in the node namespace, want 1 (conntrack-liberal)", v)
	}

	// Protected metrics, scraped as the PodMonitor does.
	tok, err := admin.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "network-node-manager-metrics-scraper",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := "https://127.0.0.1:" + port("metrics") + "/metrics"
	if code, _, err := get(metricsURL, ""); err != nil || code != 401 {
		t.Errorf("metrics without a token: %d %v, want 401", code, err)
	}
	code, body, err := get(metricsURL, tok.Status.Token)
	if err != nil || code != 200 {
		t.Fatalf("metrics as the scraper: %d %v", code, err)
	}
	for _, want := range []string{`nnm_fix_enabled{fix="conntrack-liberal"} 1`, `nnm_fix_enabled{fix="invalid-drop"} 1`,
		`nnm_fix_enabled{fix="ipvs-externalip-dnat"} 1`, `nnm_agent_ready 1`, `backend="` + backend + `"`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "nnm_sync_errors_total") && !strings.HasSuffix(line, " 0") {
			t.Errorf("sync errors: %s", line)
		}
	}

	// docs/deploy.md's dry run as `kubectl exec` runs it: a second process in the agent's container
	// (the image's PATH, the container's mounts, environment and capabilities), with exactly the
	// command and flags the page gives. It must list the rules the agent made and change nothing.
	argv := docsExecArgv(t)
	execC := c
	execC.Args = argv[1:]
	execScript := containerScript(t, containerRun{dir: filepath.Join(dir, "exec"), hostRoot: hostRoot, rootfs: rootfs,
		pod: ds.Spec.Template.Spec, c: execC, cm: cm, files: files, env: env, entrypoint: argv[:1],
		mounts: []string{saDir + " /var/run/secrets/kubernetes.io/serviceaccount ro"}})
	before := ruleState(t, ns, backend)
	dry, err := ns.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", execScript).CombinedOutput()
	if err != nil {
		t.Errorf("docs/deploy.md's %v in the agent's container: %v\n%s", argv, err, dry)
	}
	if n := regexp.MustCompile(`dry run: (\d+) chains or tables to remove; nothing was changed`).FindSubmatch(dry); n == nil || string(n[1]) == "0" {
		t.Errorf("docs/deploy.md's %v lists nothing to remove on a node the agent programmed:\n%s", argv, dry)
	}
	if after := ruleState(t, ns, backend); after != before {
		t.Errorf("the dry run changed the rules:\nbefore\n%s\nafter\n%s", before, after)
	}

	// Events on the Node, through the in-cluster config and deploy/base's events Role.
	agenttest.Eventually(t, 30*time.Second, func() error {
		l, err := admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		synced := map[string]bool{}
		for _, e := range l.Items {
			if e.Regarding.Kind == "Node" && e.Regarding.Name == nodeName && e.Reason == events.FixSynced {
				synced[e.Action] = true
			}
		}
		if !synced["conntrack-liberal"] || !synced["invalid-drop"] {
			return fmt.Errorf("FixSynced Events on node %s for %v, want conntrack-liberal and invalid-drop", nodeName, synced)
		}
		return nil
	})

	// SIGTERM, as the kubelet stops the pod: a clean exit.
	if err := stop(); err != nil {
		t.Errorf("agent stop: %v", err)
	}

	// Uninstall: deploy/uninstall's cleanup container, run the same way on the same node (its
	// hostPath volumes are the agent's), removes the rules and writes back the sysctl's value.
	var un *appsv1.DaemonSet
	for _, o := range render(t, "uninstall") {
		if o.u.GetKind() == "DaemonSet" { // beside it: the cleanup pods' identity (Node conditions)
			un = typed[appsv1.DaemonSet](t, o)
		}
	}
	if un == nil {
		t.Fatal("deploy/uninstall renders no DaemonSet")
	}
	cleanup := un.Spec.Template.Spec.InitContainers[0]
	cleanScript := containerScript(t, containerRun{dir: filepath.Join(dir, "cleanup"), hostRoot: hostRoot, rootfs: rootfs,
		pod: un.Spec.Template.Spec, c: cleanup, entrypoint: entrypoint})
	out, err := ns.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", cleanScript).CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall cleanup container: %v\n%s\nscript:\n%s", err, out, cleanScript)
	}
	if v := strings.TrimSpace(ns.MustExec("cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal")); v != liberalBefore {
		t.Errorf("after the uninstall cleanup nf_conntrack_tcp_be_liberal = %s, want %s as before the agent\n%s", v, liberalBefore, out)
	}
	if _, err := os.Stat(filepath.Join(hostRoot, conntrackliberal.DefaultStateDir, conntrackliberal.StateFile)); !os.IsNotExist(err) {
		t.Errorf("the uninstall cleanup left conntrack-liberal's state file (%v)", err)
	}
	switch backend {
	case "iptables":
		if out := ns.MustOutput("iptables-nft-save"); strings.Contains(out, iptables.ChainPrefix) {
			t.Errorf("the uninstall cleanup left %s chains:\n%s", iptables.ChainPrefix, out)
		}
	case "nftables":
		if out := ns.MustExec("nft", "list", "tables"); strings.Contains(out, nftables.TableName("invalid-drop")) {
			t.Errorf("the uninstall cleanup left %s:\n%s", nftables.TableName("invalid-drop"), out)
		}
	}
	if !t.Failed() {
		t.Logf("%s: uninstall cleanup container: nf_conntrack_tcp_be_liberal back to %s, rules gone", backend, liberalBefore)
	}
}

// docsExecArgv is the command docs/deploy.md's dry-run block runs in the agent's container (after
// `kubectl exec POD --`).
func docsExecArgv(t *testing.T) []string {
	t.Helper()
	for line := range strings.Lines(docBlock(t, "dry-run-steps")) {
		if _, cmd, ok := strings.Cut(line, " exec "); ok && strings.HasPrefix(line, "kubectl ") {
			if _, argv, ok := strings.Cut(cmd, " -- "); ok {
				return strings.Fields(argv)
			}
		}
	}
	t.Fatal("docs/deploy.md's dry-run block has no `kubectl ... exec POD -- COMMAND`")
	return nil
}

// ruleState is the node's ruleset of one backend, as its save or list tool prints it (counters
// zeroed out, so packets do not count as a change).
func ruleState(t *testing.T, ns *netns.NS, backend string) string {
	t.Helper()
	if backend == "nftables" {
		return regexp.MustCompile(`packets \d+ bytes \d+`).ReplaceAllString(ns.MustExec("nft", "list", "ruleset"), "")
	}
	out := ns.MustOutput("iptables-nft-save")
	return regexp.MustCompile(`(?m)^#.*$|\[\d+:\d+\]`).ReplaceAllString(out, "")
}

// chainTables returns the tables of an iptables-save output that hold a chain whose name starts with
// prefix, in the order they appear.
func chainTables(save, prefix string) []string {
	var tables []string
	table := ""
	for line := range strings.Lines(save) {
		switch {
		case strings.HasPrefix(line, "*"):
			table = strings.TrimSpace(line[1:])
		case strings.HasPrefix(line, ":"+prefix) && !slices.Contains(tables, table):
			tables = append(tables, table)
		}
	}
	return tables
}

// containerRun is one container of a pod spec, run from the image's root filesystem the way a
// container runtime would (see TestImageRunsAsTheDaemonSet).
type containerRun struct {
	dir        string // its overlay and files
	hostRoot   string // where hostPath volumes live
	rootfs     string
	pod        corev1.PodSpec
	c          corev1.Container
	cm         *corev1.ConfigMap // for ConfigMap volumes
	files      map[string][]byte // extra files to write first
	env        []string          // beyond PATH and HOME
	mounts     []string          // extra mounts, "source target ro|rw"
	entrypoint []string
}

// containerScript returns the shell script that runs r.c: a mount namespace with the image's root
// read-only, /proc/sys and /sys read-only, the container's volumes at its mount paths, uid 0 with
// only the capabilities it adds, and finally exec of the entrypoint with its args.
func containerScript(t *testing.T, r containerRun) string {
	t.Helper()
	files := map[string][]byte{}
	for f, data := range r.files {
		files[f] = data
	}
	mounts := slices.Clone(r.mounts)
	for _, m := range r.c.VolumeMounts {
		var vol *corev1.Volume
		for i := range r.pod.Volumes {
			if r.pod.Volumes[i].Name == m.Name {
				vol = &r.pod.Volumes[i]
			}
		}
		if vol == nil {
			t.Fatalf("mount %s has no volume", m.Name)
		}
		var src string
		switch {
		case vol.ConfigMap != nil:
			src = filepath.Join(r.dir, "configmap-"+vol.Name)
			for k, v := range r.cm.Data {
				files[filepath.Join(src, k)] = []byte(v)
			}
		case vol.HostPath != nil && (strings.HasPrefix(vol.HostPath.Path, "/proc/") || strings.HasPrefix(vol.HostPath.Path, "/sys/")):
			src = vol.HostPath.Path // the node netns's own view, as on a node
		case vol.HostPath != nil:
			src = filepath.Join(r.hostRoot, vol.HostPath.Path)
			typ := corev1.HostPathUnset
			if vol.HostPath.Type != nil {
				typ = *vol.HostPath.Type
			}
			switch typ {
			case corev1.HostPathFileOrCreate:
				if _, err := os.Stat(src); err != nil {
					files[src] = nil
				}
			case corev1.HostPathDirectoryOrCreate:
				if err := os.MkdirAll(src, 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("hostPath %s type %s: teach this test", vol.HostPath.Path, typ)
			}
		default:
			t.Fatalf("volume %s: teach this test its type", vol.Name)
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, fmt.Sprintf("%s %s %s", src, m.MountPath, mode))
	}
	// The kubelet mounts /etc/hosts into every container (for hostNetwork pods, the node's).
	hosts := filepath.Join(r.dir, "etc-hosts")
	files[hosts] = []byte("127.0.0.1\tlocalhost\n")
	mounts = append(mounts, hosts+" /etc/hosts rw")
	for f, data := range files {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}, r.env...)

	// Capabilities: what the manifest adds after dropping ALL.
	sc := r.c.SecurityContext
	if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Fatalf("securityContext %+v: the test expects drop [ALL]", sc)
	}
	var caps []string
	for _, cp := range sc.Capabilities.Add {
		caps = append(caps, "+"+strings.ToLower(string(cp)))
	}
	capSet := "-all," + strings.Join(caps, ",")
	setpriv := []string{"/usr/bin/setpriv", "--reuid=0", "--regid=0", "--clear-groups",
		"--inh-caps=" + capSet, "--ambient-caps=" + capSet, "--bounding-set=" + capSet}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		setpriv = append(setpriv, "--no-new-privs")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Fatal("the manifest no longer asks for a read-only root filesystem: adjust this test")
	}
	argv := append(append(append(setpriv, "--", "/usr/bin/env", "-i"), env...), r.entrypoint...)
	argv = append(argv, r.c.Args...)

	var sh strings.Builder
	root, upper, work := filepath.Join(r.dir, "root"), filepath.Join(r.dir, "upper"), filepath.Join(r.dir, "work")
	fmt.Fprintf(&sh, "set -e\nmkdir -p %s %s %s\n", root, upper, work)
	fmt.Fprintf(&sh, "mount -t overlay overlay -o lowerdir=%s,upperdir=%s,workdir=%s %s\n", r.rootfs, upper, work, root)
	fmt.Fprintf(&sh, "mount -t proc proc %[1]s/proc\nmount --bind %[1]s/proc/sys %[1]s/proc/sys\nmount -o remount,bind,ro %[1]s/proc/sys\n", root)
	fmt.Fprintf(&sh, "mount -t sysfs -o ro sysfs %s/sys\n", root)
	fmt.Fprintf(&sh, "mount -t tmpfs -o nosuid,mode=755 tmpfs %[1]s/dev\nfor d in null zero random urandom; do touch %[1]s/dev/$d; mount --bind /dev/$d %[1]s/dev/$d; done\n", root)
	for _, m := range mounts {
		f := strings.Fields(m)
		src, dst := f[0], root+resolveIn(t, r.rootfs, f[1])
		fmt.Fprintf(&sh, "if [ -d %[1]s ]; then mkdir -p %[2]s; else mkdir -p $(dirname %[2]s); touch %[2]s; fi\n", src, dst)
		fmt.Fprintf(&sh, "mount --bind %s %s\n", src, dst)
		if f[2] == "ro" {
			fmt.Fprintf(&sh, "mount -o remount,bind,ro %s\n", dst)
		}
	}
	fmt.Fprintf(&sh, "mount -o remount,ro %s\n", root)
	fmt.Fprintf(&sh, "exec chroot %s %s\n", root, shellJoin(argv))
	return sh.String()
}

// forwardInNetns listens on addr inside the network namespace ns and forwards each connection to
// target, dialled from inside that namespace too.
func forwardInNetns(t *testing.T, ns *netns.NS, addr, target string) {
	t.Helper()
	netns.Serve(ns.Listen(t, addr), func(c net.Conn) {
		defer c.Close()
		var up net.Conn
		if err := ns.Do(func() error {
			var err error
			up, err = net.DialTimeout("tcp", target, 5*time.Second)
			return err
		}); err != nil {
			return
		}
		defer up.Close()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		_, _ = io.Copy(c, up)
	})
}

// resolveIn resolves the symbolic links of p inside the image root (e.g. Debian's /var/run → /run), as
// the container runtime does, so that mount points never follow a link out to the host.
func resolveIn(t *testing.T, rootfs, p string) string {
	t.Helper()
	out := "/"
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for hops := 0; len(parts) > 0; {
		next := filepath.Join(out, parts[0])
		parts = parts[1:]
		target, err := os.Readlink(filepath.Join(rootfs, next))
		if err != nil { // not a link (or not there yet: created as a directory)
			out = next
			continue
		}
		if hops++; hops > 40 {
			t.Fatalf("%s: too many links", p)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(out, target)
		}
		parts = append(strings.Split(strings.Trim(target, "/"), "/"), parts...)
		out = "/"
	}
	return out
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
