package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/staleudpconntrack"
	"github.com/network-node-manager/network-node-manager/internal/events"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// Stale UDP with real Pods (kubernetes#58336): a UDP server Pod on node-b with a hostPort (the CNI
// portmap plugin's DNAT), and a client outside the cluster (the external namespace on the bridge)
// that sends from one fixed source port every 200 ms, as statsd or syslog senders do: one conntrack
// entry on node-b carries all of its datagrams, and each refreshes it. Then the server is replaced,
// twice:
//
//   - recreated: the hostPort Pod deleted and a new one created with the same hostPort (a new pod
//     IP). The portmap plugin of the nodes (Debian's 1.1.1) deletes the UDP entries of a hostPort
//     when it adds the new Pod's mapping (containernetworking/plugins#553), so this is the case it
//     already covers, with or without the agent;
//   - by a host-network Pod listening on the same port (a DaemonSet moved to hostNetwork: true):
//     the old Pod's DEL removes its DNAT rule but not the entry (containernetworking/plugins#1190),
//     so without the agent the client's datagrams keep going to the dead pod IP for as long as it
//     sends; with stale-udp-conntrack (enabled as docs/deploy.md says: the component for its Pods
//     RBAC and the ConfigMap in the install overlay) node-b's agent deletes the entry once the old
//     Pod is gone and the host-network Pod receives.
const (
	udpNode     = "node-b"
	udpHostPort = 5300
	udpPodPort  = 5301
	// udpWindow is how long a replacement is given to receive the client's datagrams once it is
	// Ready. The agent may see the old Pod gone before the portmap plugin's DEL removed its DNAT
	// rule: the client's next datagram then makes a new entry to the dead address through that rule,
	// which the fix deletes at its next full resync (syncPeriod, 30 s in deploy/base;
	// fixes/staleudpconntrack README). Seen here: the fix deleted the entry 4 s after the Pod was
	// gone, found it recreated at the full resync 28 s later and deleted it again. The stale entry's
	// own timeout (nf_conntrack_udp_timeout_stream, 120 s) is refreshed by every datagram, so a
	// longer window would only wait longer for the same answer.
	udpWindow = 45 * time.Second
	udpPeriod = 200 * time.Millisecond
)

// udpClient sends "seq N" every udpPeriod from a fixed source port and records who answers
// (the workload's "<NAME> <line>").
type udpClient struct {
	pc     net.PacketConn
	to     *net.UDPAddr
	mu     sync.Mutex
	first  map[string]time.Time // first answer per server name
	count  map[string]int
	sent   int
	stop   chan struct{}
	closed sync.Once
}

func startUDPClient(t *testing.T, ext *netns.NS, sport int, to string) *udpClient {
	addr, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	u := &udpClient{pc: ext.ListenPacket(t, net.JoinHostPort(extIP, strconv.Itoa(sport))), to: addr,
		first: map[string]time.Time{}, count: map[string]int{}, stop: make(chan struct{})}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := u.pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
			u.mu.Lock()
			if _, ok := u.first[name]; !ok {
				u.first[name] = time.Now()
			}
			u.count[name]++
			u.mu.Unlock()
		}
	}()
	go func() {
		tick := time.NewTicker(udpPeriod)
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-u.stop:
				return
			case <-tick.C:
			}
			_, _ = u.pc.WriteTo([]byte("seq "+strconv.Itoa(i)+"\n"), u.to)
			u.mu.Lock()
			u.sent++
			u.mu.Unlock()
		}
	}()
	t.Cleanup(u.close)
	return u
}

func (u *udpClient) close() {
	u.closed.Do(func() { close(u.stop); u.pc.Close() })
}

// waitAnswer waits up to within for a first answer from name and returns when it came.
func (u *udpClient) waitAnswer(ctx context.Context, name string, within time.Duration) (time.Time, bool) {
	err := agenttest.Poll(ctx, within, 50*time.Millisecond, func() error {
		u.mu.Lock()
		defer u.mu.Unlock()
		if _, ok := u.first[name]; !ok {
			return fmt.Errorf("no answer from %s", name)
		}
		return nil
	})
	if err != nil {
		return time.Time{}, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.first[name], true
}

// udpPod is a UDP (and TCP, for the readiness probe) echo server on udpNode: behind hostPort
// udpHostPort, or on the node's own network at that port.
func udpPod(name, image string, hostNetwork bool) *corev1.Pod {
	port := udpPodPort
	if hostNetwork {
		port = udpHostPort
	}
	pod := testPod(name, udpNode, image, hostNetwork, map[string]string{"app": "stale-udp"}, "serve", fmt.Sprintf(":%d", port))
	ctr := &pod.Spec.Containers[0]
	ctr.ReadinessProbe.TCPSocket.Port = intstr.FromInt32(int32(port))
	ctr.ReadinessProbe.PeriodSeconds = 1
	if !hostNetwork {
		ctr.Ports = []corev1.ContainerPort{{Name: "udp", Protocol: corev1.ProtocolUDP, ContainerPort: udpPodPort, HostPort: udpHostPort}}
	}
	return pod
}

// replaceResult is one replacement as the client saw it.
type replaceResult struct {
	answered bool
	after    time.Duration // from the old Pod gone (deleted from the API) to the new server's first answer
	ready    time.Duration // from the old Pod gone to the new server Ready
	entry    string        // node-b's conntrack entry of the client at the end of the window
	oldIP    string
}

func (r replaceResult) String() string {
	switch {
	case r.oldIP == "":
		return "not run"
	case r.answered:
		return fmt.Sprintf("the new server receives (first answer %v after the old Pod was gone; Ready after %v)", r.after.Round(100*time.Millisecond), r.ready.Round(100*time.Millisecond))
	}
	return fmt.Sprintf("the new server receives nothing in %v (node-b: %s; the deleted Pod's IP: %s)", udpWindow, r.entry, r.oldIP)
}

// staleUDP runs both replacements once (phase "without" or "with" the agent) with its own client
// source port, and returns their outcomes.
func staleUDP(t *testing.T, c *Cluster, ext *netns.NS, phase string, sport int) (recreated, hostNet replaceResult) {
	ctx := t.Context()
	workload := c.p.images["NNM_CLUSTER_WORKLOAD_IMAGE"]
	node := c.node(udpNode)
	first := "udp-" + phase + "-1"
	if _, err := c.client.CoreV1().Pods(testNS).Create(ctx, udpPod(first, workload, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitPodsReady(testNS, 3*time.Minute, first)
	to := net.JoinHostPort(node.ip, strconv.Itoa(udpHostPort))
	client := startUDPClient(t, ext, sport, to)
	defer client.close()
	if _, ok := client.waitAnswer(ctx, first, time.Minute); !ok {
		t.Fatalf("stale UDP (%s the agent): %s from %s:%d: no answer from %s (hostPort %d) within a minute; entry: %s",
			phase, to, extIP, sport, first, udpHostPort, udpEntry(ctx, c, sport))
	}
	t.Logf("stale UDP (%s the agent): %s:%d → %s answered by %s; node-b: %s", phase, extIP, sport, to, first, udpEntry(ctx, c, sport))
	// With the agent: let stale-udp-conntrack's pass see the Pod's address held (a pass follows the
	// Pod's status update within minSyncPeriod, 1 s).
	time.Sleep(2 * time.Second)

	replace := func(old string, next *corev1.Pod) replaceResult {
		var r replaceResult
		p, err := c.client.CoreV1().Pods(testNS).Get(ctx, old, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.oldIP = p.Status.PodIP
		deletePodAndWait(t, c, old)
		gone := time.Now()
		t.Logf("stale UDP (%s the agent): %s (%s) gone; node-b: %s", phase, old, r.oldIP, udpEntry(ctx, c, sport))
		if _, err := c.client.CoreV1().Pods(testNS).Create(ctx, next, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c.waitPodsReady(testNS, 3*time.Minute, next.Name)
		r.ready = time.Since(gone)
		at, ok := client.waitAnswer(ctx, next.Name, udpWindow)
		r.answered = ok
		if ok {
			r.after = at.Sub(gone)
		}
		r.entry = udpEntry(ctx, c, sport)
		// As for the first Pod: let a pass of the fix see the new Pod's address held before the
		// next replacement deletes it (an address never seen held is never judged).
		time.Sleep(2 * time.Second)
		if phase == "with" {
			t.Logf("stale UDP (with the agent): %s's agent on it:\n%s", udpNode, staleUDPLogLines(ctx, c))
		}
		return r
	}
	second := "udp-" + phase + "-2"
	recreated = replace(first, udpPod(second, workload, false))
	t.Logf("stale UDP (%s the agent): hostPort Pod %s (%s) deleted, %s created with the same hostPort: %s; node-b: %s",
		phase, first, recreated.oldIP, second, recreated, recreated.entry)
	if phase == "without" && recreated.answered {
		t.Logf("stale UDP (without the agent): the portmap plugin deleted the hostPort's UDP entries when it added %s's mapping (containernetworking/plugins#553)", second)
	}
	host := "udp-" + phase + "-hostnet"
	hostNet = replace(second, udpPod(host, workload, true))
	t.Logf("stale UDP (%s the agent): hostPort Pod %s (%s) deleted, host-network Pod %s listening on port %d: %s",
		phase, second, hostNet.oldIP, host, udpHostPort, hostNet)
	client.mu.Lock()
	t.Logf("stale UDP (%s the agent): the client sent %d datagrams, answers by server: %v", phase, client.sent, client.count)
	client.mu.Unlock()
	deletePodAndWait(t, c, host)
	return recreated, hostNet
}

// staleUDPLogLines are the lines of node-b's agent about stale-udp-conntrack.
func staleUDPLogLines(ctx context.Context, c *Cluster) string {
	logs, err := agentLogs(ctx, c, udpNode)
	if err != nil {
		return err.Error()
	}
	var l []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, staleudpconntrack.ID) || strings.Contains(line, "stale UDP") {
			l = append(l, strings.TrimSpace(line))
		}
	}
	return strings.Join(l[max(0, len(l)-8):], "\n")
}

// udpEntry is node-b's conntrack entry of the client's flow (from its fixed source port), with its
// kernel id (which does not tell a new entry from the old one: the kernel hashes the entry's
// address, which it reuses, and its original tuple, which the client keeps).
func udpEntry(ctx context.Context, c *Cluster, sport int) string {
	out, err := c.node(udpNode).Shell(ctx, c, fmt.Sprintf("conntrack -L -p udp -s %s --sport %d -o id 2>/dev/null", extIP, sport))
	if err != nil {
		return err.Error()
	}
	out = strings.TrimSpace(out)
	if out == "" {
		return "no entry"
	}
	// The reply direction's source is where the entry sends the client's datagrams.
	if m := regexp.MustCompile(`src=\S+ dst=\S+ sport=\d+ dport=\d+ .*?(src=(\S+) dst=\S+ sport=(\d+)).*?(id=\d+)?$`).FindStringSubmatch(lastLine(out)); m != nil {
		return "entry to " + m[2] + ":" + m[3] + " " + m[4]
	}
	return lastLine(out)
}

func deletePodAndWait(t *testing.T, c *Cluster, name string) {
	ctx := t.Context()
	if err := c.client.CoreV1().Pods(testNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	agenttest.Eventually(t, 3*time.Minute, func() error {
		_, err := c.client.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("pod %s still there", name)
		}
		return err
	})
}

// enableStaleUDP enables stale-udp-conntrack as docs/deploy.md says: its component (the Pods RBAC)
// under the install overlay's components: and the fix enabled in the overlay's ConfigMap patch,
// applied; then waits for node-b's agent to post FixSynced for it.
func enableStaleUDP(t *testing.T, c *Cluster) {
	start := time.Now()
	out := applyConfig(t, c, enableFix(staleudpconntrack.ID), "stale-udp-conntrack")
	t.Logf("kubectl apply -k %s (stale-udp-conntrack's component and the fix enabled in the ConfigMap patch):\n%s", installOverlay, strings.TrimSpace(out))
	took := agenttest.Eventually(t, 4*time.Minute, func() error {
		evs, err := c.client.EventsV1().Events("default").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if fixSyncedOn(e, staleudpconntrack.ID, udpNode) && e.CreationTimestamp.Time.After(start.Add(-time.Second)) {
				return nil
			}
		}
		return fmt.Errorf("no %s Event for %s on %s yet", events.FixSynced, staleudpconntrack.ID, udpNode)
	})
	t.Logf("%s's agent posted %s for %s %v after the apply", udpNode, events.FixSynced, staleudpconntrack.ID, took.Round(time.Second))
}

func fixSyncedOn(e eventsv1.Event, fix, node string) bool {
	return e.Reason == events.FixSynced && e.Action == fix && e.Regarding.Kind == "Node" && e.Regarding.Name == node
}

// enableFix returns an edit of the agent's config file that enables fix id (its key first in the
// fixes: block).
func enableFix(id string) func(string) string {
	return func(f string) string {
		return strings.Replace(f, "\nfixes:\n", "\nfixes:\n  "+id+":\n    enabled: true\n", 1)
	}
}
