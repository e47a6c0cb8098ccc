package watch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

func TestFileSourceReadsExample(t *testing.T) {
	f, err := watch.LoadFile("../../examples/services.yaml", resources(t))
	if err != nil {
		t.Fatal(err)
	}
	svcs := fileView(t, f).Services()
	if len(svcs) != 5 {
		t.Fatalf("want the 5 example Services, got %d", len(svcs))
	}
	for i := 1; i < len(svcs); i++ {
		a, b := svcs[i-1], svcs[i]
		if a.Namespace > b.Namespace || (a.Namespace == b.Namespace && a.Name > b.Name) {
			t.Fatalf("Services not sorted: %s/%s before %s/%s", a.Namespace, a.Name, b.Namespace, b.Name)
		}
	}
	if n := fileView(t, f).Node(); n == nil || len(n.Spec.PodCIDRs) != 2 {
		t.Fatalf("Node with two pod CIDRs expected, got %+v", n)
	}
}

func TestFileSourceErrorsNameTheDocument(t *testing.T) {
	for name, c := range map[string]struct{ doc, want string }{
		"unknown kind":  {"apiVersion: v1\nkind: Endpoints\nmetadata: {name: p}\n", `document 1: kind "Endpoints"`},
		"pod no name":   {"apiVersion: v1\nkind: Pod\nspec: {}\n", "Pod without metadata.name"},
		"unknown field": {"apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {portz: []}\n", "portz"},
		"no name":       {"apiVersion: v1\nkind: Service\nspec: {}\n", "without metadata.name"},
		"bad yaml":      {"kind: Service\n  - [\n", "document 1"},
		"second doc":    {"apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\nkind: Secret\n", "document 2"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := watch.ParseFile("x.yaml", []byte(c.doc), resources(t))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want an error containing %q, got %v", c.want, err)
			}
		})
	}
}

func TestFileSourceListsAndDefaults(t *testing.T) {
	doc := `apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: b}
    spec: {clusterIP: 10.96.0.2}
  - apiVersion: v1
    kind: Service
    metadata: {name: a, namespace: x, annotations: {big: value}}
    spec: {clusterIP: 10.96.0.1}
`
	f, err := watch.ParseFile("list.yaml", []byte(doc), resources(t))
	if err != nil {
		t.Fatal(err)
	}
	svcs := fileView(t, f).Services()
	if len(svcs) != 2 || svcs[0].Namespace != "default" || svcs[1].Name != "a" {
		t.Fatalf("list not read with the default namespace: %+v", svcs)
	}
	if len(svcs[1].ClusterIPs) != 1 || svcs[1].ClusterIPs[0] != netip.MustParseAddr("10.96.0.1") {
		t.Fatalf("file Services must be in the compact form informer ones are in: %+v", svcs[1])
	}
}

func TestInformersWatchOnlyWhatIsNeeded(t *testing.T) {
	called := false
	s := newInformers(func() (kube.Interface, error) { called = true; return kubetest.From(fake.NewClientset()), nil }, "n1",
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background(), needs{}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if called {
		t.Fatal("a client was built although no fix needs a watch")
	}
	if err := s.WaitForSync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestInformersSnapshotAndChanges(t *testing.T) {
	cs := fake.NewClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "z", Annotations: map[string]string{"a": "b"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "y"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}},
	)
	s, ctx := startInformers(t, fakeClient(cs), needs{Services: true, Node: true})
	if err := s.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	svcs := s.Services()
	if len(svcs) != 2 || svcs[0].Namespace != "a" || svcs[1].Name != "z" {
		t.Fatalf("want 2 sorted Services, got %+v", svcs)
	}
	if n := s.Node(); n == nil || n.Spec.PodCIDRs[0] != "10.244.1.0/24" {
		t.Fatalf("node not seen: %+v", n)
	}
	drainChanges(s)
	svcNeeds, podNeeds := needs{Services: true}, needs{Pods: true}
	v0, p0 := s.Version(svcNeeds), s.Version(podNeeds)
	if _, err := cs.CoreV1().Services("c").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "c", Name: "new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Changes():
	case <-ctx.Done():
		t.Fatal("no change signalled after a Service was created")
	}
	// The Services' version moved with the signal, and only after the change was visible; the
	// version of what reads Pods (and the Node) did not.
	if v := s.Version(svcNeeds); v == v0 || len(s.Services()) != 3 {
		t.Fatalf("after the signal: version %d (before %d), %d Services; want a new version and 3 Services", v, v0, len(s.Services()))
	}
	if p := s.Version(podNeeds); p != p0 {
		t.Fatalf("a Service event moved the version of what reads Pods: %d → %d", p0, p)
	}
	// The new Service reaches the snapshot.
	agenttest.Until(t, 5*time.Second, func() bool { return len(s.Services()) == 3 })
	// The Services the event did not touch are the same objects (what lets fixes skip them), and
	// the list handed out before is not modified.
	now := s.Services()
	if len(now) != 3 || now[0] != svcs[0] || now[1] != svcs[1] || now[2].Namespace != "c" || len(svcs) != 2 {
		t.Fatalf("want a/y and b/z unchanged before c/new, and the old list intact: before %d, now %d Services", len(svcs), len(now))
	}
}

func names(svcs []*fix.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Namespace+"/"+s.Name)
	}
	return out
}

func drainChanges(s *informers) {
	for {
		select {
		case <-s.Changes():
		default:
			return
		}
	}
}

func TestInformersPodsStrippedAndSorted(t *testing.T) {
	pod := func(ns, name, ip string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "x"}},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "img"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		}
	}
	cs := fake.NewClientset(pod("b", "p2", "10.244.1.3"), pod("a", "p1", "10.244.1.2"))
	s, ctx := startInformers(t, fakeClient(cs), needs{Pods: true})
	if err := s.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	pods := s.Pods()
	if len(pods) != 2 || pods[0].Name != "p1" || pods[1].Name != "p2" {
		t.Fatalf("want p1, p2 sorted, got %+v", pods)
	}
	if p := pods[0]; p.Labels != nil || p.Spec.Containers != nil || p.Status.PodIPs[0].IP != "10.244.1.2" || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != "n1" {
		t.Fatalf("pod not stripped to identity, phase and addresses: %+v", p)
	}
	if s.Services() != nil || s.Node() != nil {
		t.Fatal("only the Pods watch was asked for")
	}
}

// startInformers starts informers for node n1 on the clients of newClient, watching needs, with a
// context that ends after 10 s; both end with the test.
func startInformers(t *testing.T, newClient func() (kube.Interface, error), needs needs) (*informers, context.Context) {
	t.Helper()
	s := newInformers(newClient, "n1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if err := s.Start(ctx, needs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, ctx
}

// fakeClient hands out cs.
func fakeClient(cs kubernetes.Interface) func() (kube.Interface, error) {
	return func() (kube.Interface, error) { return kubetest.From(cs), nil }
}

// waitRetries waits up to 20 s until the informers made n requests (counted by count, e.g. the
// failed ones) and fails the test when they did not: they gave up instead of retrying.
func waitRetries(t *testing.T, count *atomic.Int64, n int64, what string) {
	t.Helper()
	agenttest.Eventually(t, 20*time.Second, func() error {
		if got := count.Load(); got < n {
			return fmt.Errorf("only %d %s, want %d; the informers did not retry", got, what, n)
		}
		return nil
	})
}

// TestUnreachableAPIServerIsLoggedOnce guards issue #15 item 2: with the API server down (a closed
// loopback port), client-go's streaming list retries "connection refused" without calling the watch
// error handler, so nothing was logged. Through WrapTransport the cause is logged at once, and
// repeated failures within APIErrorLogEvery add no line.
func TestUnreachableAPIServerIsLoggedOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	var failures atomic.Int64
	var logs testkit.LogBuffer
	var s *informers
	s = newInformers(func() (kube.Interface, error) {
		rc := &rest.Config{Host: "http://" + addr}
		rc.Wrap(s.hub.WrapTransport)
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { // around WrapTransport: counts every failure
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					failures.Add(1)
				}
				return resp, err
			})
		})
		return kube.New(rc)
	}, "n1", slog.New(slog.NewTextHandler(&logs, nil)))
	if err := s.Start(context.Background(), needs{Services: true, Node: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	waitRetries(t, &failures, 4, "failed requests")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var api []string
	for _, l := range lines {
		if strings.Contains(l, "API server") {
			api = append(api, l)
		}
	}
	if len(api) != 1 {
		t.Fatalf("%d failed requests logged %d lines, want 1:\n%s", failures.Load(), len(api), logs.String())
	}
	for _, want := range []string{"connection refused", addr, "level=ERROR"} {
		if !strings.Contains(api[0], want) {
			t.Errorf("the API error line does not name %q: %s", want, api[0])
		}
	}
}

// TestThrottlingIsLogged: an API server answering 429 to every request is retried by client-go's
// streaming list without a call to the watch error handler; WrapTransport logs it once per
// APIErrorLogEvery.
func TestThrottlingIsLogged(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	var logs testkit.LogBuffer
	var s *informers
	s = newInformers(func() (kube.Interface, error) {
		rc := &rest.Config{Host: srv.URL}
		rc.Wrap(s.hub.WrapTransport)
		return kube.New(rc)
	}, "n1", slog.New(slog.NewTextHandler(&logs, nil)))
	if err := s.Start(context.Background(), needs{Services: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	waitRetries(t, &requests, 3, "requests")
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "throttles") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "429") || !strings.Contains(lines[0], "/api/v1/services") {
		t.Fatalf("%d throttled requests logged %d lines, want 1 naming 429 and the request:\n%s", requests.Load(), len(lines), logs.String())
	}
}

// A second Start adds the watches a reload's newly enabled fix reads (issue 19, item 3), and
// NeedsSynced names a watch that was not started instead of calling it synced.
func TestInformersStartAddsWatches(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p1"}, Spec: corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.1.2"}}}}
	cs := fake.NewClientset(node, pod)
	clients := 0
	s, ctx := startInformers(t, func() (kube.Interface, error) { clients++; return kubetest.From(cs), nil }, needs{Services: true})
	if err := s.WaitForNeeds(ctx, needs{Services: true}); err != nil {
		t.Fatal(err)
	}
	err := s.NeedsSynced(needs{Node: true, Pods: true})
	if err == nil || !strings.Contains(err.Error(), "Node (not started)") || !strings.Contains(err.Error(), "Pods (not started)") {
		t.Fatalf("NeedsSynced before the watches started = %v; want both named as not started", err)
	}
	if err := s.Start(ctx, needs{Services: true, Node: true, Pods: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitForNeeds(ctx, needs{Node: true, Pods: true}); err != nil {
		t.Fatal(err)
	}
	if s.Node() == nil || len(s.Pods()) != 1 || clients != 1 {
		t.Fatalf("after the second Start: node %v, pods %v, clients made %d (want 1)", s.Node(), s.Pods(), clients)
	}
	if got := s.Started(); got != (needs{Services: true, Node: true, Pods: true}) {
		t.Fatalf("Started = %+v", got)
	}
}

// Without a node name the Pods watch cannot run: a fix reading Pods is never told it synced.
func TestInformersPodsWithoutNodeNameNeverSync(t *testing.T) {
	s := newInformers(func() (kube.Interface, error) { return kubetest.From(fake.NewClientset()), nil }, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background(), needs{Pods: true, Node: true}); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if err := s.NeedsSynced(needs{Pods: true}); err == nil || !strings.Contains(err.Error(), "no node name") {
		t.Fatalf("NeedsSynced(Pods) without a node name = %v", err)
	}
	if err := s.NeedsSynced(needs{Node: true}); err != nil {
		t.Fatalf("the Node without a node name (configured pod CIDRs) = %v; want nil", err)
	}
}
