package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/servertest"
)

// The Pod network of the flood: the node's end of the veth, the flooding Pods' 500 addresses, and
// one more Pod (a scraper) that does not flood.
const (
	floodNodeAddr    = "10.250.0.1"
	floodScraperAddr = "10.250.3.1"
	floodSources     = 500
	floodPerSource   = 16
	floodFor         = 30 * time.Second
)

// floodSourceAddrs are the flooding Pods' addresses: 10.250.1.1 on.
func floodSourceAddrs() []string {
	out := make([]string, floodSources)
	for i := range out {
		out[i] = fmt.Sprintf("10.250.%d.%d", 1+i/250, 1+i%250)
	}
	return out
}

// TestProbesThroughPodFlood (issue #63 row 2), with the real agent run as deploy/base configures
// its listeners and probes (healthzAddress, metricsAddress, metricsSecure, GOMEMLIMIT; the liveness
// probe's host, port and timeout), against the real API server: 500 Pod addresses behind a veth open
// 16 idle keep-alive connections each to the node's probe and metrics ports and re-dial 2 s after
// each close. The kubelet probes /livez as the DaemonSet says, from the node; a Pod that does not
// flood scrapes /metrics with a token. At main 3f85643 (probe port on the node's address, the
// listener's fair share admitting a new source only against one holding two more) /livez failed 10
// of 10 times and would have restarted the agent. Now every probe answers within the probe's
// timeout, with deploy/base's probe port on the loopback (which no Pod reaches) and with a probe port
// on the node's address probed from there (an operator's healthzAddress: 0.0.0.0), and the scrape
// gets the metrics; the latencies and the agent's memory are printed.
func TestProbesThroughPodFlood(t *testing.T) {
	c := sharedCluster(t, "nftables")
	agentC, cfg := deployBase(t)
	healthz, _ := cfg["healthzAddress"].(string)
	_, port, _ := net.SplitHostPort(healthz)
	t.Run("deploy-base", func(t *testing.T) { probeFlood(t, c, agentC, cfg, healthz, agentC.LivenessProbe.HTTPGet.Host) })
	t.Run("probe-port-on-the-node-address", func(t *testing.T) { probeFlood(t, c, agentC, cfg, net.JoinHostPort("0.0.0.0", port), "") })
}

// probeFlood runs the agent with deploy/base's settings but healthz, floods it from the Pods and
// probes /livez at probeHost (empty: the node's address, as the kubelet probes a host-network Pod).
func probeFlood(t *testing.T, c *cluster, agentC corev1.Container, cfg map[string]any, healthz, probeHost string) {
	metricsAddr, _ := cfg["metricsAddress"].(string)
	_, healthzPort, _ := net.SplitHostPort(healthz)
	_, metricsPort, _ := net.SplitHostPort(metricsAddr)
	probe := agentC.LivenessProbe.HTTPGet
	var env []string
	for _, e := range agentC.Env {
		if e.Name == "GOMEMLIMIT" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	n := startNode(t, c, "nftables", nodeOptions{noWait: true, env: env, args: []string{
		"--metrics-address", metricsAddr, "--metrics-secure=" + fmt.Sprint(cfg["metricsSecure"]), "--healthz-address", healthz}})

	// The Pod network: a veth from the node to a namespace holding the Pods' addresses.
	pods := netns.New(t, "nnm-pods")
	n.ns.Veth("pods0", pods, "eth0")
	n.ns.AddAddrs("pods0", floodNodeAddr+"/16")
	var batch strings.Builder
	for _, a := range append(floodSourceAddrs(), floodScraperAddr) {
		fmt.Fprintf(&batch, "addr add %s/16 dev eth0\n", a)
	}
	if stderr, err := pods.Run(t.Context(), "ip", []string{"-batch", "-"}, strings.NewReader(batch.String()), nil); err != nil {
		t.Fatalf("add the Pods' addresses: %v: %s", err, stderr)
	}

	// The kubelet: the DaemonSet's probe, from the node (the pod IP of a host-network Pod is the
	// node's address; a host names the address itself).
	if probeHost == "" {
		probeHost = floodNodeAddr
	}
	livez := "http://" + net.JoinHostPort(probeHost, healthzPort) + probe.Path
	timeout := time.Duration(agentC.LivenessProbe.TimeoutSeconds) * time.Second
	kubelet := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: netns.DialContext(n.ns.Path(), &net.Dialer{Timeout: timeout})}}
	agenttest.Eventually(t, readyTimeout, func() error {
		code, body, err := netns.Get(t.Context(), kubelet, "http://"+net.JoinHostPort(probeHost, healthzPort)+"/readyz", "")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		return nil
	})
	if ip := net.ParseIP(probeHost); ip != nil && ip.IsLoopback() {
		// No Pod reaches the probe port: on the node's address nothing listens there.
		err := pods.Do(func() error {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(floodNodeAddr, healthzPort), 5*time.Second)
			if err == nil {
				conn.Close()
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("a Pod dialing the node's probe port: %v, want connection refused", err)
		}
	}

	token := floodScraperToken(t, c)
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // self-signed, as the PodMonitor's
		DialContext:     netns.DialContext(pods.Path(), &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(floodScraperAddr)}})}}

	// The flood, from the Pods' namespace (a child process of this test binary in it).
	flood := make(chan error, 1)
	go func() {
		out, stderr, err := pods.RunChild("TestPodFloodChild", "NNM_FLOOD_TARGETS="+
			net.JoinHostPort(floodNodeAddr, healthzPort)+"=http,"+net.JoinHostPort(floodNodeAddr, metricsPort)+"=https")
		t.Logf("the flood: %s", strings.TrimSpace(string(out)))
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr)
		}
		flood <- err
	}()
	time.Sleep(5 * time.Second) // the flood fills the listeners

	t0 := time.Now()
	code, body, err := netns.Get(t.Context(), scraper, "https://"+net.JoinHostPort(floodNodeAddr, metricsPort)+"/metrics", token)
	scrapeTook := time.Since(t0)
	if err != nil || code != http.StatusOK || !strings.Contains(body, "nnm_server_connections") {
		t.Errorf("a scrape from a Pod that does not flood: %d %v after %v", code, err, scrapeTook.Round(time.Millisecond))
	}
	var took []time.Duration
	for range 20 {
		t0 := time.Now()
		code, body, err := netns.Get(t.Context(), kubelet, livez, "")
		d := time.Since(t0)
		took = append(took, d)
		if err != nil || code != http.StatusOK {
			t.Errorf("the kubelet's %s during the flood: %d %q %v after %v", livez, code, body, err, d.Round(time.Millisecond))
		}
		time.Sleep(500 * time.Millisecond)
	}
	m, _ := agenttest.ParseMetrics(body)
	probeHeld, _ := m.Value("nnm_server_connections", "listener", "healthz")
	metricsHeld, _ := m.Value("nnm_server_connections", "listener", "metrics")
	rss, hwm := procMemory(t, n.agent.PID())
	slices.Sort(took)
	t.Logf("during the flood (%d sources × %d): the kubelet's %s p50 %v, worst %v of %d; a scrape from a Pod %d in %v; the listeners hold %v (probe) and %v (metrics) connections; the agent's RSS %s, peak %s",
		floodSources, floodPerSource, livez, took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took),
		code, scrapeTook.Round(time.Millisecond), probeHeld, metricsHeld, rss, hwm)
	if err := <-flood; err != nil {
		t.Errorf("the flood: %v", err)
	}
}

// TestPodFloodChild is the flood of TestProbesThroughPodFlood, run by it inside the Pods'
// namespace: floodPerSource idle connections from each Pod address to each of NNM_FLOOD_TARGETS
// (address=http or address=https) for floodFor.
func TestPodFloodChild(t *testing.T) {
	netns.Child(t, "TestProbesThroughPodFlood")
	ctx, stop := context.WithTimeout(t.Context(), floodFor)
	defer stop()
	var answered, failed atomic.Int64
	var waits []func()
	for _, target := range strings.Split(os.Getenv("NNM_FLOOD_TARGETS"), ",") {
		addr, scheme, _ := strings.Cut(target, "=")
		path := "/livez"
		if scheme == "https" {
			path = "/metrics"
		}
		waits = append(waits, servertest.Flood(ctx, floodSourceAddrs(), floodPerSource, addr, scheme == "https", path, 2*time.Second, &answered, &failed))
	}
	for _, wait := range waits {
		wait()
	}
	fmt.Printf("%d answers to idle connections, %d connections closed or refused before an answer\n", answered.Load(), failed.Load())
}

// floodScraperToken is a token of a ServiceAccount bound to deploy/base's ClusterRole
// network-node-manager-metrics-reader, as a Prometheus in a Pod has.
func floodScraperToken(t *testing.T, c *cluster) string {
	t.Helper()
	ctx := t.Context()
	name := "flood-scraper"
	if _, err := c.admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "network-node-manager-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: name}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = c.admin.CoreV1().ServiceAccounts("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	tr, err := c.admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
