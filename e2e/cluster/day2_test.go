package cluster

// Day 2 on the same cluster boot, after the upgrade from the previous release and the fixes' proofs
// (issue #38): a configuration change through the overlay, rolled out node by node; a ConfigMap
// edited in place that does not load; /metrics scraped by a Pod with real ServiceAccount tokens; the
// agent's Node Events; 10,000 Services under the manifest's memory limit; the kubelet's probes and
// restarts over the run; the uninstall, which must return each node's netfilter state to what it was
// before the install.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/backends/nftables"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/invaliddrop"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
	"github.com/network-node-manager/network-node-manager/fixes/mssclamp"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// day2Env selects the kube-proxy modes whose cluster also runs day 2 after the fixes' proofs: a
// comma-separated list ("ipvs", "ipvs,nftables"), "1" or "all" for every mode, "" or "0" for none.
// `make test-cluster` sets it (Makefile.cluster.mk says which modes by default, and why).
const day2Env = "NNM_CLUSTER_DAY2"

func day2Modes() map[string]bool {
	m := map[string]bool{}
	switch v := os.Getenv(day2Env); v {
	case "", "0":
	case "1", "all":
		m["ipvs"], m["nftables"] = true, true
	default:
		for _, mode := range strings.Split(v, ",") {
			m[strings.TrimSpace(mode)] = true
		}
	}
	return m
}

// scaleCoverWait bounds the wait, after the last of the 10,000 Services got its External-IP, for every
// agent to cover them all. Under emulation that took 1m54s, 2m38s and 3m28s after the last create in
// three passing runs (the agents' restores share the node's one emulated CPU with kube-proxy and the
// kubelet); the bound is a test's patience, not a product figure (make bench measures the change
// latency on a real CPU).
const scaleCoverWait = 10 * time.Minute

const (
	upgradeSuffix = "-upgrade" // the second tag: the release's plus this
	scaleServices = 10000
	// The label kube-proxy leaves a Service alone for (it serves only Services without it): the
	// 10,000 Services load the agent, not the nodes' kube-proxy under emulation.
	serviceProxyName = "service.kubernetes.io/service-proxy-name"
	configMapName    = "network-node-manager"
	reloadRejected   = "config file changed but does not load; keeping the running configuration"
	badKey           = "notAKey"
	scraperSA        = "network-node-manager-metrics-scraper" // deploy/components/podmonitor
	dryRunMarker     = "<!-- dry-run-steps -->"
	uninstallMarker  = "<!-- uninstall-steps -->"
	samplerDir       = "/run/nnm-sampler"
)

// day2 runs the stages in order; each is a subtest, so one failing does not hide the next. It
// returns the mss-clamp row of the without/with table (without: measured before the install).
func day2(t *testing.T, c *Cluster, cur *bundle, before map[string][]string, mssAddr, mssWithout string) []row {
	d := &day2State{c: c, newTag: cur.version}
	mssWith := "not run"
	t.Run("mss-clamp", func(t *testing.T) { mssWith = d.enableMSSClamp(t, mssAddr) })
	t.Run("bad-configmap", func(t *testing.T) { d.badConfigMap(t) })
	t.Run("metrics-scrape", func(t *testing.T) { scrapeMetrics(t, c) })
	t.Run("node-events", func(t *testing.T) { d.nodeEvents(t) })
	t.Run("10000-services", func(t *testing.T) { scaleMemory(t, c) })
	t.Run("probes-restarts", func(t *testing.T) { probesAndRestarts(t, c, d.newTag) })
	t.Run("uninstall", func(t *testing.T) { uninstall(t, c, before) })
	return []row{{"MSS black hole (mss-clamp)", c.mode, mssRowClient(), mssWithout, mssWith}}
}

type day2State struct {
	c      *Cluster
	mss    bool   // mss-clamp enabled and its rules seen on every node
	good   string // the ConfigMap's file before the bad one
	newTag string // the version the agents run
}

// updateConfig replaces the file of the ConfigMap the agents mount with edit(file), in place (the
// hot reload of docs/deploy.md's "Changing the configuration"), and makes the kubelets refresh it.
func (d *day2State) updateConfig(t *testing.T, edit func(string) string) {
	ctx := t.Context()
	cm := liveConfig(t, d.c)
	cm.Data["config.yaml"] = edit(cm.Data["config.yaml"])
	if _, err := d.c.client.CoreV1().ConfigMaps(agentNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kickKubelet(ctx, d.c); err != nil {
		t.Error(err)
	}
}

// enableMSSClamp enables mss-clamp as docs/deploy.md's "Changing the configuration" says: a patch of
// the ConfigMap in the install overlay, applied and rolled out node by node (applyConfig), waits for
// its rules on every node and downloads again.
func (d *day2State) enableMSSClamp(t *testing.T, addr string) string {
	ctx := t.Context()
	c := d.c
	out := applyConfig(t, c, enableFix(mssclamp.ID))
	t.Logf("kubectl apply -k %s (mss-clamp enabled in a ConfigMap patch of the overlay):\n%s", installOverlay, strings.TrimSpace(out))
	start := time.Now()
	markers := mssMarkers(c.mode)
	for _, n := range c.nodes {
		err := agenttest.Poll(ctx, 4*time.Minute, 3*time.Second, func() error {
			// iptables-legacy-save without -t: asked for a table by name it creates it (the empty
			// legacy mangle table the uninstall check once found left over, internal/detect.IptablesSave).
			out, err := n.Shell(ctx, c, "{ iptables-nft-save -t mangle; iptables-legacy-save; nft list tables; } 2>/dev/null")
			if err != nil {
				return err
			}
			for _, m := range markers {
				if strings.Contains(out, m) {
					return nil
				}
			}
			return fmt.Errorf("%s: no %v yet", n.name, markers)
		})
		if err != nil {
			t.Fatalf("mss-clamp enabled in the overlay's ConfigMap: %v", err)
		}
	}
	t.Logf("mss-clamp's rules on every node %v after the rollout", time.Since(start).Round(time.Second))
	d.mss = true
	with, ok := download(ctx, c, addr)
	t.Logf("with the agent (mss-clamp): %s from client-a: %s", addr, with)
	if !ok {
		t.Errorf("with mss-clamp the download should complete: %s", with)
	}
	return with
}

// mssMarkers are lines of enableMSSClamp's probe once mss-clamp's rules are there: `nft list tables`
// prints "table ip NAME" (no brace), iptables-save "-A CHAIN ...".
func mssMarkers(mode string) []string {
	if mode == "nftables" {
		return []string{"table ip " + nftables.TableName(mssclamp.ID) + "\n"}
	}
	return []string{"-A " + iptables.ChainPrefix + mssclamp.ChainName + " "}
}

// agentPods lists the agent's Pods, one per node.
func agentPods(t *testing.T, c *Cluster) []corev1.Pod {
	t.Helper()
	pods, err := c.client.CoreV1().Pods(agentNS).List(t.Context(), metav1.ListOptions{LabelSelector: agentLabel})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// agentLogs is the log of the agent on node.
func agentLogs(ctx context.Context, c *Cluster, node string) (string, error) {
	pods, err := c.client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: agentLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	if len(pods.Items) != 1 {
		return "", fmt.Errorf("%s: %d agent Pods, want 1", node, len(pods.Items))
	}
	return c.Kubectl(ctx, "", "-n", agentNS, "logs", pods.Items[0].Name)
}

// ruleMarkers are what the sampler's baseline (e2e/cluster/sampler) must show of the enabled fixes'
// rules on a node in this mode, by backend (ipv4 and ipv6: the ConfigMap's families): an nnm-*
// table's rules, or an NNM- chain's (as the netlink dump of iptables-nft names them, "CHAIN: rule",
// or as iptables-legacy-save prints them, "-A CHAIN ").
func ruleMarkers(mode string, mss bool) [][]string {
	chain := func(name string) []string {
		return []string{" " + iptables.ChainPrefix + name + ": rule ", "-A " + iptables.ChainPrefix + name + " "}
	}
	var m [][]string
	if mode == "nftables" {
		for _, f := range []string{"ip", "ip6"} {
			m = append(m, []string{"\t" + f + " " + nftables.TableName(invaliddrop.ID) + " "})
		}
		if mss { // the pod CIDRs it clamps to are IPv4 only on this cluster: no ip6 table
			m = append(m, []string{"\tip " + nftables.TableName(mssclamp.ID) + " "})
		}
		return m
	}
	m = append(m, chain(invaliddrop.ChainName(rules.Input)))
	if mss {
		m = append(m, chain(mssclamp.ChainName))
	}
	if mode == "ipvs" {
		m = append(m, chain(ipvsexternalipdnat.ChainDNAT))
	}
	return m
}

// sampler is e2e/cluster/sampler, which hack/cluster/images.sh builds beside the images; the nodes
// run it from this machine's root.
func (c *Cluster) sampler() string { return filepath.Join(c.p.imagesDir, "sampler") }

// startSampler starts the sampler on n (every 100 ms until stopSampler) with env (samplerEnv); it
// returns the baseline once taken.
func startSampler(ctx context.Context, c *Cluster, n *Node, env string) (string, error) {
	// The directory goes first: an earlier run's baseline in it would pass the wait below, and the
	// new sampler's own clearing of it could then remove it under the cat.
	script := "rm -rf " + samplerDir + "\n" +
		env + " setsid " + c.sampler() + " run " + samplerDir + " 100ms </dev/null >/run/nnm-sampler.log 2>&1 &\n" +
		"i=0; until [ -s " + samplerDir + "/baseline ]; do i=$((i+1)); [ $i -lt 300 ] || { cat /run/nnm-sampler.log; exit 1; }; sleep 0.2; done; cat " + samplerDir + "/baseline"
	return n.Shell(ctx, c, script)
}

// stopSampler stops it and returns its summary and the first samples that lacked rules.
func stopSampler(ctx context.Context, c *Cluster, n *Node) (string, error) {
	return n.Shell(ctx, c, "touch "+samplerDir+"/stop; i=0; until [ -e "+samplerDir+"/done ]; do i=$((i+1)); [ $i -lt 300 ] || { cat /run/nnm-sampler.log; exit 1; }; sleep 0.2; done; cat "+samplerDir+"/summary; cat "+samplerDir+"/missing 2>/dev/null; true")
}

// checkRules compares the node's rules now with the sampler's baseline; it returns what is missing.
func checkRules(ctx context.Context, c *Cluster, n *Node, env string) (string, error) {
	out, err := n.Shell(ctx, c, env+" "+c.sampler()+" check "+samplerDir)
	return strings.TrimSpace(out), err
}

// samplerEnv is the sampler's environment for the agent on node, from its "environment" log line:
// nf_tables over netlink (the nftables backend, iptables-nft) needs none; the iptables-legacy variant
// is sampled through its save commands.
func samplerEnv(ctx context.Context, c *Cluster, node string) (string, error) {
	logs, err := agentLogs(ctx, c, node)
	if err != nil {
		return "", err
	}
	backend := regexp.MustCompile(`msg=environment .*\bbackend=(\w+)`).FindStringSubmatch(logs)
	variant := regexp.MustCompile(`msg=environment .*\biptablesVariant=(\w+)`).FindStringSubmatch(logs)
	if backend == nil || variant == nil {
		return "", fmt.Errorf("%s: no environment line with backend= and iptablesVariant= in the agent's log:\n%s", node, tailString(logs, 20))
	}
	if backend[1] == "iptables" && variant[1] == "legacy" {
		return "NNM_SAMPLER_SAVES='iptables-legacy-save ip6tables-legacy-save'", nil
	}
	return "", nil
}

// holdConn is `workload hold` in client-a through kubectl exec -i: closing stdin ends it.
type holdConn struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	from  string // the client's address, from its first line
	done  chan error
	out   strings.Builder
	mu    sync.Mutex
}

func startHold(t *testing.T, c *Cluster, addr string) *holdConn {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.p.bin, "kubectl"), "-n", testNS, "exec", "-i", "client-a", "--", "/workload", "hold", addr)
	cmd.Env = append(cmd.Environ(), "KUBECONFIG="+c.kubeconfig)
	h := &holdConn{cmd: cmd, done: make(chan error, 1)}
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.mu.Lock()
			h.out.WriteString(sc.Text() + "\n")
			h.mu.Unlock()
			if _, from, ok := strings.Cut(sc.Text(), " from "); ok && strings.HasPrefix(sc.Text(), "holding ") {
				first <- from
			}
		}
		h.done <- cmd.Wait()
	}()
	select {
	case h.from = <-first:
	case err := <-h.done:
		t.Fatalf("workload hold %s in client-a ended at once: %v: %s", addr, err, h.output())
	case <-time.After(2 * time.Minute):
		t.Fatalf("workload hold %s in client-a printed no address", addr)
	}
	return h
}

func (h *holdConn) output() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.TrimSpace(h.out.String())
}

// stop closes its stdin and returns its last line; an error is a failed round trip.
func (h *holdConn) stop() (string, error) {
	h.stdin.Close()
	select {
	case err := <-h.done:
		return lastLine(h.output()), err
	case <-time.After(time.Minute):
		_ = h.cmd.Process.Kill()
		return h.output(), errors.New("workload hold did not end a minute after its stdin closed")
	}
}

// conntrackID is the id of the conntrack entry of the connection from addr (IP:port) on n.
func conntrackID(ctx context.Context, c *Cluster, n *Node, addr string) (string, error) {
	ip, port, _ := strings.Cut(addr, ":")
	out, err := n.Shell(ctx, c, "conntrack -L -p tcp -s "+ip+" --sport "+port+" -o id 2>/dev/null")
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`\bid=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s: no conntrack entry from %s: %q", n.name, addr, out)
	}
	return m[1] + " (" + strings.TrimSpace(lastLine(out)) + ")", nil
}

func mustOutput(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return string(out)
}

// kickKubelet makes the kubelets sync the agent's Pods now, which refreshes their ConfigMap volume
// (otherwise within the kubelet's sync period, about a minute): an annotation change is a Pod update.
func kickKubelet(ctx context.Context, c *Cluster) error {
	_, err := c.Kubectl(ctx, "", "-n", agentNS, "annotate", "pods", "-l", agentLabel, "--overwrite",
		"nnm-test/kick="+strconv.FormatInt(time.Now().UnixNano(), 10))
	return err
}

// badConfigMap pushes a ConfigMap whose file does not load (an unknown key): each running agent must
// log it, keep its rules and stay Ready; the metric and the Event are checked by the next stages.
func (d *day2State) badConfigMap(t *testing.T) {
	ctx := t.Context()
	c := d.c
	d.updateConfig(t, func(f string) string { d.good = f; return f + badKey + ": true\n" })
	pushed := time.Now()
	for _, n := range c.nodes {
		var line string
		err := agenttest.Poll(ctx, 4*time.Minute, 3*time.Second, func() error {
			logs, err := agentLogs(ctx, c, n.name)
			if err != nil {
				return err
			}
			for _, l := range strings.Split(logs, "\n") {
				if strings.Contains(l, reloadRejected) && strings.Contains(l, badKey) {
					line = l
					return nil
				}
			}
			return fmt.Errorf("%s: the agent has not logged %q naming %s", n.name, reloadRejected, badKey)
		})
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s, %v after the ConfigMap update: %s", n.name, time.Since(pushed).Round(time.Second), line)
		env, err := samplerEnv(ctx, c, n.name)
		if err != nil {
			t.Error(err)
			continue
		}
		if missing, err := checkRules(ctx, c, n, env); err != nil || missing != "" {
			t.Errorf("%s: after the bad ConfigMap the agent's rules lack:\n%s (%v)", n.name, missing, err)
		}
	}
	for _, pod := range agentPods(t, c) {
		if !podReady(&pod) {
			t.Errorf("agent %s on %s is not Ready after the bad ConfigMap: %v", pod.Name, pod.Spec.NodeName, containerStates(&pod))
		}
	}
}

// scrape runs `workload scrape` in a Pod and returns the status code and the body.
func scrape(ctx context.Context, c *Cluster, ns, pod, url, tokenFile string) (int, string, error) {
	out, err := c.Kubectl(ctx, "", "-n", ns, "exec", pod, "--", "/workload", "scrape", url, tokenFile)
	if err != nil {
		return 0, out, err
	}
	first, body, _ := strings.Cut(out, "\n")
	code, err := strconv.Atoi(strings.TrimPrefix(first, "status "))
	if err != nil {
		return 0, out, fmt.Errorf("scrape %s: %q", url, first)
	}
	return code, body, nil
}

func metricLines(body string, names ...string) string {
	var b strings.Builder
	for _, l := range strings.Split(body, "\n") {
		for _, n := range names {
			if strings.HasPrefix(l, n) {
				b.WriteString(l + "\n")
			}
		}
	}
	return strings.TrimSpace(b.String())
}

const (
	projectedToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	secretTokenDir = "/scraper-secret"
)

// scrapeMetrics scrapes each node's /metrics as docs/deploy.md says Prometheus does: the scraper
// ServiceAccount of deploy/components/podmonitor (applied as it is, without the PodMonitor), its
// token Secret filled in by kube-controller-manager, and the token the kubelet mounts; a token whose
// ServiceAccount lacks the reader role gets 403, none 401.
func scrapeMetrics(t *testing.T, c *Cluster) {
	ctx := t.Context()
	if out, err := c.Kubectl(ctx, c.p.root, "apply", "-f", "deploy/components/podmonitor/metrics-scraper.yaml"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("%s", strings.TrimSpace(out))
	}
	took := agenttest.Eventually(t, 2*time.Minute, func() error {
		s, err := c.client.CoreV1().Secrets(agentNS).Get(ctx, scraperSA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Data["token"]) == 0 {
			return errors.New("the token controller has not filled in the scraper's Secret")
		}
		return nil
	})
	t.Logf("kube-controller-manager filled in Secret %s/%s's token after %v", agentNS, scraperSA, took.Round(100*time.Millisecond))
	workload := c.p.images["NNM_CLUSTER_WORKLOAD_IMAGE"]
	scraper := scrapePod("scraper", agentNS, scraperSA, workload)
	scraper.Spec.Volumes = []corev1.Volume{{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: scraperSA}}}}
	scraper.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "token", MountPath: secretTokenDir, ReadOnly: true}}
	for _, p := range []*corev1.Pod{scraper, scrapePod("noscrape", testNS, "default", workload)} {
		if _, err := c.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agenttest.Eventually(t, 5*time.Minute, func() error {
		for _, p := range [][2]string{{agentNS, "scraper"}, {testNS, "noscrape"}} {
			pod, err := c.client.CoreV1().Pods(p[0]).Get(ctx, p[1], metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !podReady(pod) {
				return fmt.Errorf("pod %s/%s: %s %v", p[0], p[1], pod.Status.Phase, containerStates(pod))
			}
		}
		return nil
	})
	type want struct {
		ns, pod, node, token string
		code                 int
	}
	url := func(node string) string { return "https://" + c.node(node).ip + ":9484/metrics" }
	for _, w := range []want{
		{agentNS, "scraper", "node-a", projectedToken, 200},
		{agentNS, "scraper", "node-b", projectedToken, 200},
		{agentNS, "scraper", "node-a", secretTokenDir + "/token", 200},
		{testNS, "noscrape", "node-a", projectedToken, 403},
		{agentNS, "scraper", "node-a", "-", 401},
	} {
		code, body, err := scrape(ctx, c, w.ns, w.pod, url(w.node), w.token)
		if err != nil {
			t.Errorf("%s/%s → %s: %v", w.ns, w.pod, url(w.node), err)
			continue
		}
		t.Logf("Pod %s/%s on node-a, token %s → %s: %d", w.ns, w.pod, w.token, url(w.node), code)
		if code != w.code {
			t.Errorf("%s/%s with %s → %s: status %d, want %d: %s", w.ns, w.pod, w.token, url(w.node), code, w.code, tailString(body, 5))
			continue
		}
		if code != 200 {
			continue
		}
		got := metricLines(body, "nnm_agent_ready", "nnm_config_reloads_total", "nnm_agent_info")
		t.Logf("%s\n", got)
		if !strings.Contains(got, "nnm_agent_ready 1") {
			t.Errorf("%s: nnm_agent_ready is not 1:\n%s", w.node, got)
		}
		if !strings.Contains(got, `nnm_config_reloads_total{result="error"} 1`) {
			t.Errorf("%s: after the bad ConfigMap want nnm_config_reloads_total{result=\"error\"} 1:\n%s", w.node, got)
		}
	}
}

func scrapePod(name, ns, sa, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: "node-a", ServiceAccountName: sa, TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "workload", Image: image, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"}}},
		},
	}
}

// nodeEvents: `kubectl events --for node/NAME` shows what the agent posted on each Node: the fixes
// synced (by the upgraded pods too) and the rejected ConfigMap.
func (d *day2State) nodeEvents(t *testing.T) {
	ctx := t.Context()
	c := d.c
	for _, n := range c.nodes {
		var out string
		err := agenttest.Poll(ctx, 2*time.Minute, 3*time.Second, func() (err error) {
			out, err = c.Kubectl(ctx, "", "events", "--for", "node/"+n.name)
			if err != nil {
				return err
			}
			for _, reason := range []string{"FixEnabled", "FixSynced", "ConfigReloadRejected"} {
				if !strings.Contains(out, reason) {
					return fmt.Errorf("%s: `kubectl events --for node/%s` shows no %s:\n%s", n.name, n.name, reason, out)
				}
			}
			return nil
		})
		if err != nil {
			t.Error(err)
			continue
		}
		var agent []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "Fix") || strings.Contains(l, "Config") || strings.Contains(l, "LAST SEEN") {
				agent = append(agent, l)
			}
		}
		t.Logf("kubectl events --for node/%s (the agent's lines):\n%s", n.name, strings.Join(agent, "\n"))
	}
	// The file that loaded, back.
	if d.good != "" {
		d.updateConfig(t, func(string) string { return d.good })
	}
}

// agentCgroup reads the agent's container cgroup (cgroup v2) on n.
func agentCgroup(ctx context.Context, c *Cluster, n *Node) (map[string]string, error) {
	out, err := n.Shell(ctx, c, `pid=$(busybox pidof network-node-manager)
cg=/sys/fs/cgroup$(cut -d: -f3 /proc/$pid/cgroup)
for f in memory.current memory.peak memory.max; do echo "$f $(cat $cg/$f)"; done
grep -E '^oom_kill ' $cg/memory.events
# The Pod's cgroup outlives a restarted container: its (hierarchical) count covers them all.
echo "pod_oom_kill $(sed -n 's/^oom_kill //p' $(dirname $cg)/memory.events)"`)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			m[k] = v
		}
	}
	return m, nil
}

func mib(v string) string {
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return v
	}
	return fmt.Sprintf("%.1f MiB", n/(1<<20))
}

// scaleMemory creates 10,000 LoadBalancer Services with an External-IP each (parallel creates, then
// their status), which kube-proxy leaves alone (service-proxy-name), and reads the agent container's
// memory.peak and oom_kill from its cgroup under the manifest's limit. In IPVS mode
// ipvs-externalip-dnat must cover all of them (its metric, scraped).
func scaleMemory(t *testing.T, c *Cluster) {
	ctx := t.Context()
	cfg := c.cp.AdminRESTConfig()
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Half of the lowest namespace budget per namespace (iptables's, the backend in IPVS mode).
	perNS := fix.MinBudget().PerNamespace / 2
	nsOf := func(i int) string { return fmt.Sprintf("nnm-scale-%d", i/perNS) }
	for i := 0; i < scaleServices; i += perNS {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsOf(i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]map[string]string{}
	for _, n := range c.nodes {
		if before[n.name], err = agentCgroup(ctx, c, n); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	no := false
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= scaleServices || ctx.Err() != nil {
					return
				}
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: nsOf(i), Labels: map[string]string{serviceProxyName: "nnm-test-none"}},
					Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, AllocateLoadBalancerNodePorts: &no,
						Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
				}
				svc, err := client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{})
				if err == nil {
					svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("172.16.%d.%d", i/250, i%250+1)}}
					_, err = client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
				}
				if err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d Services failed; the first: %v", failed.Load(), scaleServices, firstErr)
	}
	t.Logf("%d LoadBalancer Services created and given an External-IP (64 clients in parallel) in %v", scaleServices, time.Since(start).Round(100*time.Millisecond))
	if c.mode == "ipvs" {
		took, covered := time.Duration(0), ""
		err := agenttest.Poll(ctx, scaleCoverWait, 5*time.Second, func() error {
			for _, n := range c.nodes {
				code, body, err := scrape(ctx, c, agentNS, "scraper", "https://"+n.ip+":9484/metrics", projectedToken)
				if err != nil || code != 200 {
					return fmt.Errorf("scrape %s: %d %v", n.name, code, err)
				}
				covered = metricLines(body, "nnm_ipvs_externalip_dnat_services")
				v := regexp.MustCompile(`nnm_ipvs_externalip_dnat_services\{family="ipv4",state="covered"\} (\d+)`).FindStringSubmatch(covered)
				if v == nil {
					return fmt.Errorf("%s: no covered ipv4 Services in %q", n.name, covered)
				}
				if k, _ := strconv.Atoi(v[1]); k < scaleServices {
					return fmt.Errorf("%s: ipvs-externalip-dnat covers %d Services, want at least %d", n.name, k, scaleServices)
				}
			}
			took = time.Since(start)
			return nil
		})
		if err != nil {
			t.Error(err)
		} else {
			t.Logf("every agent's ipvs-externalip-dnat covers them %v after the first create:\n%s", took.Round(time.Second), covered)
		}
	}
	// The watch events reach the agents within seconds; let memory settle: memory.peak unchanged
	// over two reads 10 s apart.
	for _, n := range c.nodes {
		var cg map[string]string
		prev := ""
		_ = agenttest.Poll(ctx, 3*time.Minute, 10*time.Second, func() error {
			var err error
			if cg, err = agentCgroup(ctx, c, n); err != nil {
				return err
			}
			if cg["memory.peak"] != prev {
				prev = cg["memory.peak"]
				return errors.New("memory.peak still rising")
			}
			return nil
		})
		b := before[n.name]
		t.Logf("%s: the agent's container cgroup with %d Services (%s mode): memory.current %s, memory.peak %s (before the Services: current %s, peak %s), memory.max %s, oom_kill %s",
			n.name, scaleServices, c.mode, mib(cg["memory.current"]), mib(cg["memory.peak"]), mib(b["memory.current"]), mib(b["memory.peak"]), mib(cg["memory.max"]), cg["oom_kill"])
		if cg["memory.max"] != strconv.Itoa(128<<20) {
			t.Errorf("%s: memory.max %s, want the manifest's 128Mi", n.name, cg["memory.max"])
		}
		if cg["oom_kill"] != "0" || cg["pod_oom_kill"] != "0" {
			t.Errorf("%s: oom_kill %s (the Pod's cgroup: %s), want 0", n.name, cg["oom_kill"], cg["pod_oom_kill"])
		}
	}
}

// probesAndRestarts: every agent Ready, on the new tag, with no restart; what the kubelet's prober
// logged about the agent over the run.
func probesAndRestarts(t *testing.T, c *Cluster, newTag string) {
	for _, pod := range agentPods(t, c) {
		if !podReady(&pod) {
			t.Errorf("agent %s on %s is not Ready: %v", pod.Name, pod.Spec.NodeName, containerStates(&pod))
		}
		for _, st := range pod.Status.ContainerStatuses {
			if st.RestartCount != 0 {
				t.Errorf("agent %s on %s restarted %d times (last state %+v)", pod.Name, pod.Spec.NodeName, st.RestartCount, st.LastTerminationState)
				// Why: the previous container's last lines and what the kubelet said about the Pod.
				prev, err := c.Kubectl(t.Context(), "", "-n", agentNS, "logs", pod.Name, "--previous")
				t.Logf("agent %s: the previous container's log (last lines, %v):\n%s", pod.Name, err, tailString(prev, 30))
				evs, err := c.Kubectl(t.Context(), "", "-n", agentNS, "events", "--for", "pod/"+pod.Name)
				t.Logf("kubectl -n %s events --for pod/%s (%v):\n%s", agentNS, pod.Name, err, tailString(evs, 20))
			}
		}
		t.Logf("agent %s on %s: %v, image %s", pod.Name, pod.Spec.NodeName, containerStates(&pod), pod.Spec.Containers[0].Image)
	}
	for _, n := range c.nodes {
		data := tail(filepath.Join(n.dir, "kubelet.log"), 1<<30)
		var failed []string
		for _, l := range strings.Split(data, "\n") {
			if strings.Contains(l, "Probe failed") && strings.Contains(l, "network-node-manager") {
				failed = append(failed, l)
			}
		}
		// By kind: the liveness probe's settings (deploy/base) were chosen from what this stage
		// does to the probes under emulation, and only its failures restart the agent.
		kinds := map[string]int{}
		for _, l := range failed {
			_, kind, _ := strings.Cut(l, `probeType="`)
			kind, _, _ = strings.Cut(kind, `"`)
			kinds[kind]++
		}
		t.Logf("%s: the kubelet logged %d failed probes of the agent over the run (upgrade to %s included; Liveness %d, Readiness %d)%s",
			n.name, len(failed), newTag, kinds["Liveness"], kinds["Readiness"], firstLines(failed, 3))
		if len(failed) > 3 {
			t.Logf("%s: the last ones:\n%s", n.name, strings.Join(failed[max(3, len(failed)-5):], "\n"))
		}
	}
}

func firstLines(l []string, n int) string {
	if len(l) == 0 {
		return ""
	}
	return ":\n" + strings.Join(l[:min(n, len(l))], "\n")
}

// The netfilter state of a node, as the uninstall must restore it: every iptables variant and
// family, the nftables ruleset, the sysctls a fix may write.
const netfilterDump = `for s in iptables-nft-save ip6tables-nft-save iptables-legacy-save ip6tables-legacy-save; do
	echo "== $s"; $s 2>/dev/null || echo "(exit $?)"
done
echo "== nft list ruleset"; nft list ruleset 2>&1
echo "== sysctl"; sysctl net.netfilter.nf_conntrack_tcp_be_liberal net.ipv4.ip_forward 2>&1`

// iptables-nft's own tables, which the nft dump shows too: compared as iptables-nft-save prints them.
var iptablesNFTTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// normalizeNetfilter makes a dump comparable: no comments or counters, and none of kube-proxy's
// and the CNI plugins' own lines (KUBE-*, CNI-* chains and the jumps to them, nftables tables
// kube-proxy), which change with the Pods and Services the test makes; each line keeps its section.
func normalizeNetfilter(dump string) []string {
	counters := regexp.MustCompile(` \[\d+:\d+\]$|counter packets \d+ bytes \d+`)
	var out []string
	section, skip := "", false
	for _, l := range strings.Split(dump, "\n") {
		if s, ok := strings.CutPrefix(l, "== "); ok {
			section, skip = s, false
			continue
		}
		if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
			continue
		}
		if section == "nft list ruleset" {
			if f := strings.Fields(l); len(f) == 4 && f[0] == "table" {
				skip = f[2] == "kube-proxy" || (f[1] == "ip" || f[1] == "ip6") && iptablesNFTTables[f[2]]
			}
			if skip {
				if l == "}" {
					skip = false
				}
				continue
			}
		}
		ours := strings.Contains(l, "NNM-") || strings.Contains(l, "nnm-")
		if !ours && (strings.Contains(l, "KUBE-") || strings.Contains(l, "CNI-")) {
			continue
		}
		out = append(out, section+": "+counters.ReplaceAllString(l, ""))
	}
	return out
}

// netfilterState dumps and normalizes every node's state.
func netfilterState(ctx context.Context, c *Cluster) (map[string][]string, error) {
	s := map[string][]string{}
	for _, n := range c.nodes {
		out, err := n.Shell(ctx, c, netfilterDump)
		if err != nil {
			return nil, err
		}
		s[n.name] = normalizeNetfilter(out)
	}
	return s, nil
}

// lineDiff returns the lines only in a and only in b (as multisets).
func lineDiff(a, b []string) (onlyA, onlyB []string) {
	count := map[string]int{}
	for _, l := range a {
		count[l]++
	}
	for _, l := range b {
		count[l]--
	}
	for l, n := range count {
		for ; n > 0; n-- {
			onlyA = append(onlyA, l)
		}
		for ; n < 0; n++ {
			onlyB = append(onlyB, l)
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	return onlyA, onlyB
}

// uninstall runs docs/deploy.md's dry run on node-a and its uninstall block, then compares each
// node's netfilter state with the one before the install.
func uninstall(t *testing.T, c *Cluster, before map[string][]string) {
	ctx := t.Context()
	// What this test added besides the install: the scraper and its Pods.
	for _, args := range [][]string{
		{"-n", agentNS, "delete", "pod", "scraper", "--ignore-not-found", "--wait"},
		{"-n", testNS, "delete", "pod", "noscrape", "--ignore-not-found", "--wait"},
		{"delete", "-f", "deploy/components/podmonitor/metrics-scraper.yaml", "--ignore-not-found"},
	} {
		if _, err := c.Kubectl(ctx, c.p.root, args...); err != nil {
			t.Error(err)
		}
	}
	dry := regexp.MustCompile(`(?m)^NODE=\S+$`).ReplaceAllString(docBlock(t, c.p.root, dryRunMarker), "NODE=node-a")
	var out strings.Builder
	if err := docsScript(ctx, t, c, dry, &out); err != nil {
		t.Errorf("docs/deploy.md's dry run on node-a: %v:\n%s", err, out.String())
	} else {
		t.Logf("docs/deploy.md's dry run on node-a (cleanup --dry-run through kubectl exec):\n%s", tailString(out.String(), 30))
		if !strings.Contains(out.String(), "NNM-") && !strings.Contains(out.String(), "nnm-") {
			t.Errorf("the dry run names none of the agent's chains or tables")
		}
	}
	script := docBlock(t, c.p.root, uninstallMarker)
	out.Reset()
	start := time.Now()
	err := docsScript(ctx, t, c, script, &out)
	t.Logf("docs/deploy.md's uninstall steps took %v:\n%s", time.Since(start).Round(time.Second), tailString(out.String(), 40))
	if err != nil {
		t.Fatalf("docs/deploy.md's uninstall steps: %v", err)
	}
	compareAfterUninstall(t, c, before)
}

// compareAfterUninstall: no agent Pod is left, and each node's netfilter state and sysctls are what
// they were before the install.
func compareAfterUninstall(t *testing.T, c *Cluster, before map[string][]string) {
	t.Helper()
	ctx := t.Context()
	if pods := agentPods(t, c); len(pods) != 0 {
		t.Errorf("agent Pods left after the uninstall: %d", len(pods))
	}
	after, err := netfilterState(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		gone, extra := lineDiff(before[n.name], after[n.name])
		if len(gone)+len(extra) > 0 {
			t.Errorf("%s: the netfilter state after the uninstall differs from before the install (kube-proxy's and the CNI's lines aside):\nonly before:\n%s\nonly after:\n%s",
				n.name, strings.Join(gone, "\n"), strings.Join(extra, "\n"))
		} else {
			t.Logf("%s: netfilter state after the uninstall = before the install (%d lines compared: 4 iptables dumps, the nftables ruleset, the sysctls)", n.name, len(after[n.name]))
		}
		if st, err := n.Shell(ctx, c, "ls -la /run/network-node-manager 2>&1; true"); err == nil {
			t.Logf("%s: /run/network-node-manager after the uninstall:\n%s", n.name, strings.TrimSpace(st))
			if strings.Contains(st, "agent-netns-") {
				t.Errorf("%s: the uninstall left the node lock file (cleanup deletes it when no agent runs)", n.name)
			}
		}
	}
}
