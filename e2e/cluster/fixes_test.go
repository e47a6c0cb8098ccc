package cluster

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// ModesEnv selects kube-proxy's modes, one cluster each (default both).
const ModesEnv = "NNM_CLUSTER_MODES"

// The Services and Pods of the fixes' proofs.
const (
	lbIP        = "203.0.113.10" // the LoadBalancer Service's External-IP, set through its status
	servicePort = 80
	serverPort  = 8080
	testNS      = "default"
	agentNS     = "kube-system"
	agentLabel  = "app.kubernetes.io/name=network-node-manager"
	// connectTimeout is the client's: an answer within it is "connects", none is "times out".
	connectTimeout = "5s"
)

// row is one line of the without/with table in the log (and the lane's report).
type row struct{ fix, mode, client, without, with string }

// TestCluster boots a two-node cluster per kube-proxy mode, installs the agent as docs/deploy.md
// says and proves the fixes with real Pods, without the agent and then with it.
func TestCluster(t *testing.T) {
	p := require(t)
	modes := []string{"ipvs", "nftables"}
	if v := os.Getenv(ModesEnv); v != "" {
		modes = strings.Split(v, ",")
	}
	for mode := range day2Modes() {
		if mode != "ipvs" && mode != "nftables" {
			t.Fatalf("%s=%q: unknown kube-proxy mode %q (ipvs, nftables, all, 0)", day2Env, os.Getenv(day2Env), mode)
		}
		if mode == helmMode() {
			t.Fatalf("%s=%q: day 2 changes the kustomize overlay, and %s mode installs with Helm (%s=%s): run day 2 in the other mode", day2Env, os.Getenv(day2Env), mode, helmModeEnv, helmMode())
		}
	}
	var rows []row
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { rows = append(rows, runMode(t, p, mode)...) })
	}
	var b strings.Builder
	b.WriteString("| fix | kube-proxy | client | without the agent | with the agent |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.fix, r.mode, r.client, r.without, r.with)
	}
	t.Logf("observed with real Pods:\n%s", b.String())
}

func runMode(t *testing.T, p prerequisites, mode string) []row {
	ctx := t.Context()
	c := startCluster(t, p, mode)
	ext := newExternal(t, c)
	mssAddr := newMSSPath(t, c)
	for _, n := range c.nodes {
		took := agenttest.Eventually(t, 5*time.Minute, func() error {
			out, err := n.Shell(ctx, c, "busybox wget -qO- http://127.0.0.1:10249/proxyMode")
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) != mode {
				return fmt.Errorf("%s: kube-proxy's /proxyMode is %q, want %s", n.name, out, mode)
			}
			return nil
		})
		t.Logf("%s: kube-proxy answers /proxyMode=%s (after another %v)", n.name, mode, took.Round(time.Second))
	}

	workload := p.images["NNM_CLUSTER_WORKLOAD_IMAGE"]
	pods := []*corev1.Pod{
		testPod("server-b", "node-b", workload, false, map[string]string{"app": "lb-local"}, "serve", fmt.Sprintf(":%d", serverPort)),
		testPod("hostnet-a", "node-a", workload, true, nil, "pause"),
		testPod("client-a", "node-a", workload, false, nil, "pause"),
	}
	for _, pod := range pods {
		if _, err := c.client.CoreV1().Pods(testNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := lbLocalService(t, c)
	took := c.waitPodsReady(testNS, 5*time.Minute, "server-b", "hostnet-a", "client-a")
	t.Logf("test Pods Ready after %v", took.Round(time.Second))
	clusterIP := fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, servicePort)
	lb := fmt.Sprintf("%s:%d", lbIP, servicePort)

	// The Service works by its ClusterIP from both clients: what fails below is the External-IP path.
	for _, from := range []string{"hostnet-a", "client-a"} {
		var got string
		took := agenttest.Eventually(t, 2*time.Minute, func() (err error) {
			got, err = connect(ctx, c, from, clusterIP)
			return err
		})
		t.Logf("ClusterIP %s from %s: %q (after %v)", clusterIP, from, got, took.Round(time.Second))
	}
	without := map[string]string{}
	for _, from := range []string{"hostnet-a", "client-a"} {
		got, err := connect(ctx, c, from, lb)
		without[from] = outcome(got, err)
		t.Logf("without the agent: External-IP %s from %s on node-a (endpoint on node-b only): %s", lb, from, without[from])
	}
	if mode == "ipvs" && !strings.HasPrefix(without["hostnet-a"], "times out") {
		t.Fatalf("kubernetes#75262 did not reproduce: the host-network client %s without the agent", without["hostnet-a"])
	}
	resetWithout := injectReset(t, c, ext, 8080)
	t.Logf("without the agent: kubernetes#74839 from client-a: %s", resetWithout)
	if !resetWithout.reset() || resetWithout.rsts != 1 {
		t.Fatalf("kubernetes#74839 did not reproduce without the agent: %s", resetWithout)
	}

	mssWithout, ok := download(ctx, c, mssAddr)
	t.Logf("without the agent: %s from client-a (node-a's route mtu %s, ICMP dropped): %s", mssAddr, narrowMTU, mssWithout)
	if ok {
		t.Fatalf("the MSS black hole did not reproduce without the agent: %s", mssWithout)
	}

	// A subtest: its failure does not stop the other proofs (nor day 2).
	var udpRecreatedWithout, udpHostNetWithout replaceResult
	t.Run("stale-udp-without", func(t *testing.T) {
		udpRecreatedWithout, udpHostNetWithout = staleUDP(t, c, ext, "without", 40000)
		if udpHostNetWithout.answered {
			t.Errorf("kubernetes#58336 did not reproduce without the agent: the host-network replacement received the fixed-port client's datagrams: %s", udpHostNetWithout)
		}
	})

	// The netfilter state the uninstall must restore (day2).
	before, err := netfilterState(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	// The release (release_test.go): the previous one installed, upgraded to this commit's as
	// docs/deploy.md says (kustomize, or Helm in helmMode), rolled back and forward, sampled.
	prev := previousRelease(t, c)
	pushBundle(t, c, prev)
	installPrevious(t, c, prev)
	cur := upgradeFromPrevious(t, c, prev)
	rollbackAndForward(t, c, prev, cur)
	checkAgents(t, c)

	with := map[string]string{}
	for _, from := range []string{"hostnet-a", "client-a"} {
		var got string
		var err error
		agenttest.Eventually(t, time.Minute, func() error {
			got, err = connect(ctx, c, from, lb)
			return err
		})
		with[from] = outcome(got, err)
		t.Logf("with the agent: External-IP %s from %s on node-a: %s", lb, from, with[from])
	}
	resetWith := injectReset(t, c, ext, 8081)
	t.Logf("with the agent: kubernetes#74839 from client-a: %s", resetWith)
	if resetWith.reset() || resetWith.rsts != 0 || !strings.Contains(resetWith.client, "still here") {
		t.Errorf("with the agent the connection should survive the out-of-window segment: %s", resetWith)
	}
	var udpRecreatedWith, udpHostNetWith replaceResult
	t.Run("stale-udp-with", func(t *testing.T) {
		enableStaleUDP(t, c)
		udpRecreatedWith, udpHostNetWith = staleUDP(t, c, ext, "with", 40001)
		for _, r := range []replaceResult{udpRecreatedWith, udpHostNetWith} {
			if !r.answered {
				t.Errorf("with stale-udp-conntrack the replacement should receive the fixed-port client's datagrams: %s", r)
			}
		}
	})
	rows := []row{{"kubernetes#74839 (invalid-drop)", mode, "Pod on node-a → server outside the cluster (masqueraded)", resetWithout.String(), resetWith.String()}}
	for _, from := range []string{"hostnet-a", "client-a"} {
		client := map[string]string{"hostnet-a": "host-network Pod on node-a", "client-a": "Pod on node-a"}[from]
		rows = append(rows, row{"kubernetes#75262 (ipvs-externalip-dnat)", mode, client, without[from], with[from]})
	}
	udpClient := fmt.Sprintf("client outside the cluster, fixed source port, every %v → node-b:%d/UDP (hostPort); ", udpPeriod, udpHostPort)
	rows = append(rows,
		row{"kubernetes#58336 (stale-udp-conntrack)", mode, udpClient + "the Pod deleted and recreated with the same hostPort", udpRecreatedWithout.String(), udpRecreatedWith.String()},
		row{"kubernetes#58336 (stale-udp-conntrack)", mode, udpClient + "the Pod deleted, a host-network Pod on the port", udpHostNetWithout.String(), udpHostNetWith.String()})
	// Day 2 in the same cluster boot, after the proofs, in the modes day2Modes selects.
	if c.helm {
		// Day 2 changes the kustomize overlay: the Helm install ends with its own uninstall.
		t.Run("helm-uninstall", func(t *testing.T) { helmUninstall(t, c, cur, before) })
		releaseReport(t, c)
		return rows
	}
	if !day2Modes()[mode] {
		t.Logf("day 2 not run in %s mode (%s=%q)", mode, day2Env, os.Getenv(day2Env))
		releaseReport(t, c)
		return rows
	}
	t.Run("day2", func(t *testing.T) { rows = append(rows, day2(t, c, cur, before, mssAddr, mssWithout)...) })
	releaseReport(t, c)
	return rows
}

func outcome(got string, err error) string {
	if err != nil {
		why := lastLine(err.Error())
		if _, w, ok := strings.Cut(err.Error(), "workload: "); ok {
			why, _, _ = strings.Cut(w, "\n") // the client's own account, not kubectl's exit status
		}
		if strings.Contains(why, "i/o timeout") || strings.Contains(why, "no answer") {
			return "times out (" + why + ")"
		}
		return "fails (" + why + ")"
	}
	return "connects (" + strings.TrimSpace(got) + ")"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// connect runs the workload's TCP client in Pod from (kubectl exec) against addr.
func connect(ctx context.Context, c *Cluster, from, addr string) (string, error) {
	return c.Kubectl(ctx, "", "-n", testNS, "exec", from, "--", "/workload", "connect", addr, connectTimeout)
}

func testPod(name, node, image string, hostNetwork bool, labels map[string]string, args ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			HostNetwork:                   hostNetwork,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "workload", Image: image, ImagePullPolicy: corev1.PullNever, Args: args,
				Env: []corev1.EnvVar{{Name: "NNM_NAME", Value: name}},
			}},
		},
	}
	if args[0] == "serve" {
		pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(serverPort)}},
			PeriodSeconds: 2,
		}
	}
	return pod
}

// lbLocalService is kubernetes#75262's Service: LoadBalancer, externalTrafficPolicy: Local, its only
// endpoint server-b on node-b; no cloud controller runs, so the External-IP is set in its status.
func lbLocalService(t *testing.T, c *Cluster) *corev1.Service {
	ctx := t.Context()
	svc, err := c.client.CoreV1().Services(testNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb-local", Namespace: testNS},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector:              map[string]string{"app": "lb-local"},
			Ports:                 []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(serverPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if svc, err = c.client.CoreV1().Services(testNS).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc
}

// checkAgents checks what the kubelet and the kernel say about the agent's Pods: Ready with no
// restart, seccomp filter mode 2 (RuntimeDefault), and its memory as its container cgroup accounts.
func checkAgents(t *testing.T, c *Cluster) {
	ctx := t.Context()
	pods, err := c.client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: agentLabel})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != len(c.nodes) {
		t.Fatalf("want one agent Pod per node (%d), got %d", len(c.nodes), len(pods.Items))
	}
	status := regexp.MustCompile(`(?m)^Seccomp:\s+(\d+)$`)
	for _, pod := range pods.Items {
		if !podReady(&pod) {
			t.Errorf("agent %s on %s is not Ready: %v", pod.Name, pod.Spec.NodeName, containerStates(&pod))
		}
		for _, st := range pod.Status.ContainerStatuses {
			if st.RestartCount != 0 {
				t.Errorf("agent %s on %s restarted %d times", pod.Name, pod.Spec.NodeName, st.RestartCount)
			}
		}
		out, err := c.node(pod.Spec.NodeName).Shell(ctx, c, `pid=$(busybox pidof network-node-manager)
grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/$pid/status
cg=/sys/fs/cgroup$(cut -d: -f3 /proc/$pid/cgroup)
echo "cgroup $cg"
for f in memory.current memory.peak memory.max; do echo "$f $(cat $cg/$f)"; done
grep -E '^oom_kill ' $cg/memory.events`)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("agent %s on %s (the node's /proc and cgroup v2):\n%s", pod.Name, pod.Spec.NodeName, out)
		if m := status.FindStringSubmatch(out); m == nil || m[1] != "2" {
			t.Errorf("agent on %s: want Seccomp: 2 (filter, the RuntimeDefault profile), got %v", pod.Spec.NodeName, m)
		}
	}
}
