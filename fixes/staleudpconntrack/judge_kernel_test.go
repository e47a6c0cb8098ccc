package staleudpconntrack

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/builtin"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// The judging tests of issue 19 (items 3 and 4), with a real kube-apiserver, the real engine and
// informers, and the real conntrack table of a node namespace (entries made by internal/testing/ctfill).
// Node n2 has no spec.podCIDRs; the configuration's documented fallback is the cluster's
// 10.244.0.0/16 and fd00:244::/48.
//
//	entry                                      DNAT target             its Pod
//	client 192.0.2.7:40000 → 198.51.100.1:8125  10.244.1.10:8125        live, this node
//	client 2001:db8::7:40000 → [2001:db8:1::1]:8125  [fd00:244:1::10]:8125  the same Pod
//	pod 10.244.1.10:40001 → 10.96.0.20:8125     10.244.2.20:8125        a pod of another node
//	client 192.0.2.7:40002 → 198.51.100.1:8126  10.244.1.11:8125        live, then deleted
const judgeNode = "n2"

type judged struct {
	name        string
	e           ctfill.Entry
	mustSurvive bool
}

var judgeEntries = []judged{
	{name: "live pod (IPv4)", mustSurvive: true, e: ctfill.Entry{Protocol: ctfill.UDP,
		Src: netip.MustParseAddrPort("192.0.2.7:40000"), Dst: netip.MustParseAddrPort("198.51.100.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.10:8125")}},
	{name: "live pod (IPv6)", mustSurvive: true, e: ctfill.Entry{Protocol: ctfill.UDP,
		Src: netip.MustParseAddrPort("[2001:db8::7]:40000"), Dst: netip.MustParseAddrPort("[2001:db8:1::1]:8125"), DNATTo: netip.MustParseAddrPort("[fd00:244:1::10]:8125")}},
	{name: "remote pod via ClusterIP", mustSurvive: true, e: ctfill.Entry{Protocol: ctfill.UDP,
		Src: netip.MustParseAddrPort("10.244.1.10:40001"), Dst: netip.MustParseAddrPort("10.96.0.20:8125"), DNATTo: netip.MustParseAddrPort("10.244.2.20:8125")}},
	{name: "pod deleted during the test", e: ctfill.Entry{Protocol: ctfill.UDP,
		Src: netip.MustParseAddrPort("192.0.2.7:40002"), Dst: netip.MustParseAddrPort("198.51.100.1:8126"), DNATTo: netip.MustParseAddrPort("10.244.1.11:8125")}},
}

// nodeReader is a rule fix that reads the Node and programs nothing, as mss-clamp or
// ipvs-externalip-dnat do: with it the Node watch runs before stale-udp-conntrack is enabled.
type nodeReader struct{}

func (nodeReader) ID() string                     { return "node-reader" }
func (nodeReader) Description() string            { return "reads the Node" }
func (nodeReader) DefaultEnabled(fix.Env) bool    { return true }
func (nodeReader) Reads() []fix.TableRef          { return []fix.TableRef{inputs.Node} }
func (nodeReader) Configure(map[string]any) error { return nil }
func (nodeReader) Rules(*fix.Snapshot, rules.Family) (*rules.Ruleset, fix.Report, error) {
	return nil, fix.Report{}, nil
}

// ids returns the kernel ids of the judged entries present in the node's table.
func ids(t *testing.T, ct inNS) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	for _, fam := range rules.Families {
		for _, e := range ct.list(t, fam, rules.UDP) {
			for _, j := range judgeEntries {
				if e.Orig.Src == j.e.Src && e.Reply.Src == j.e.DNATTo {
					out[j.name] = e.ID
				}
			}
		}
	}
	return out
}

func TestKernelJudgesOnlyKnownDead(t *testing.T) {
	netns.RequireKernel(t)
	cs := startCluster(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: judgeNode}})
	createPodOn(t, cs, judgeNode, "live", "10.244.1.10", "fd00:244:1::10")
	createPodOn(t, cs, judgeNode, "doomed", "10.244.1.11")
	// Item 3: enabled by a reload while a fix reading the Node runs. Before, the Pods watch was never
	// started, the fix saw no Pod, and deleted the live pod's entries at once and at every resync.
	t.Run("enabled-by-reload", func(t *testing.T) { judge(t, cs, true) })
	createPodOn(t, cs, judgeNode, "doomed", "10.244.1.11")
	// Item 4: enabled at start; a pod goes away, so the table is read: the flow to the pod of
	// another node, inside the fallback 10.244.0.0/16, keeps its entry.
	t.Run("remote-pod-flow", func(t *testing.T) { judge(t, cs, false) })
}

func judge(t *testing.T, cs kubernetes.Interface, byReload bool) {
	ctx := context.Background()
	node := netns.New(t, "nnm-judge")
	if err := node.Do(func() error {
		return ctfill.Create(len(judgeEntries), func(i int) ctfill.Entry { return judgeEntries[i].e })
	}); err != nil {
		t.Fatal(err)
	}
	real := inNS{node, nodestate.NewConntrack()}
	before := ids(t, real)
	if len(before) != len(judgeEntries) {
		t.Fatalf("entries made: %v", before)
	}
	c := config.Defaults()
	c.NodeName = judgeNode
	c.PodCIDRs = []string{"10.244.0.0/16", "fd00:244::/48"}
	c.MinSyncPeriod, c.SyncPeriod = 100*time.Millisecond, 500*time.Millisecond
	c.Fixes = map[string]map[string]any{ID: {"enabled": !byReload}}
	e, m, _ := runEngine(t, cs, &c, real, nodeReader{})
	agenttest.Until(t, wait, func() bool { return e.Ready() == nil })
	if byReload {
		on := c
		on.Fixes = map[string]map[string]any{ID: {"enabled": true}}
		e.Reconfigure(&on)
		agenttest.Until(t, wait, func() bool { // the fix enabled by the reload runs
			return testutil.ToFloat64(m.Enabled.WithLabelValues(ID)) == 1 && e.Ready() == nil
		})
	}
	passes(t, m, 4) // several full resyncs
	after := ids(t, real)
	for _, j := range judgeEntries {
		if after[j.name] != before[j.name] {
			t.Errorf("%s: entry id %d → %d (0: deleted) before any Pod went away", j.name, before[j.name], after[j.name])
		}
	}
	// A Pod of this node goes away: exactly its entry is deleted.
	if err := cs.CoreV1().Pods("default").Delete(ctx, "doomed", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, wait, func() bool { _, ok := ids(t, real)["pod deleted during the test"]; return !ok })
	passes(t, m, 2)
	after = ids(t, real)
	for _, j := range judgeEntries {
		if j.mustSurvive && after[j.name] != before[j.name] {
			t.Errorf("%s: entry id %d → %d (0: deleted); it goes to a live pod", j.name, before[j.name], after[j.name])
		}
	}
}

// wait bounds the waits for the engine.
const wait = 15 * time.Second

// startCluster starts a kube-apiserver for the test with the default ServiceAccount and node, and
// returns an admin client.
func startCluster(t *testing.T, node *corev1.Node) kubernetes.Interface {
	t.Helper()
	cs := controlplane.StartT(t, controlplane.Options{}).AdminClient()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cs
}

// runEngine runs stale-udp-conntrack on the conntrack seam ct, and others, in the real engine with
// the real informers of cs and configuration c, until the test ends. It returns the engine, its
// sync metrics and the registry holding both the engine's and the fix's metrics.
// passes waits (at most wait) until the fix has run n more passes: nnm_syncs_total counts each
// pass of a node-state fix once it ended, so what a check reads afterwards is what they left.
func passes(t *testing.T, m *metrics.Sync, n int) {
	t.Helper()
	count := func() float64 { return testutil.ToFloat64(m.Syncs.WithLabelValues(ID, fix.NodeBackend)) }
	want := count() + float64(n)
	agenttest.Until(t, wait, func() bool { return count() >= want })
}

func runEngine(t *testing.T, cs kubernetes.Interface, c *config.Config, ct nodestate.Conntrack, others ...fix.Fix) (*engine.Engine, *metrics.Sync, *prometheus.Registry) {
	t.Helper()
	return runEngineLogging(t, io.Discard, cs, c, ct, others...)
}

// runEngineLogging is runEngine with the log written to w.
func runEngineLogging(t *testing.T, w io.Writer, cs kubernetes.Interface, c *config.Config, ct nodestate.Conntrack, others ...fix.Fix) (*engine.Engine, *metrics.Sync, *prometheus.Registry) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(w, nil))
	reg := prometheus.NewRegistry()
	f, err := New(fix.Params{Conntrack: ct, Registry: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	hub := watch.NewHub(func() (kube.Interface, error) { return kubetest.From(cs), nil }, c.NodeName, log)
	ins, err := builtin.All()
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewSync(reg)
	e, err := engine.New(engine.Options{Fixes: append([]fix.Fix{f}, others...), Backend: testkit.NewFakeBackend(), Hub: hub, Inputs: ins,
		Config: c, Env: fix.Env{NodeName: c.NodeName}, Metrics: m, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e, m, reg
}

func createPodOn(t *testing.T, cs kubernetes.Interface, node, name string, ips ...string) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "statsd", Image: "example.invalid/statsd"}}},
	}
	created, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = corev1.PodRunning
	for _, ip := range ips {
		created.Status.PodIPs = append(created.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	created.Status.PodIP = ips[0]
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
