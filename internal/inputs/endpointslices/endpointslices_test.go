package endpointslices_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/builtin"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

func slice(name, svc string, nodes ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc, "other": "x"}}, AddressType: discoveryv1.AddressTypeIPv4}
	for i, n := range nodes {
		ready := true
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.1." + string(rune('1'+i))},
			NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, Hints: &discoveryv1.EndpointHints{}})
	}
	return s
}

// localReader is a diagnose-like fix: it counts the ready endpoints of default/web on this node.
type localReader struct{ local atomic.Int32 }

func (*localReader) ID() string                     { return "local-reader" }
func (*localReader) Description() string            { return "counts web's endpoints on this node" }
func (*localReader) DefaultEnabled(fix.Env) bool    { return true }
func (*localReader) Reads() []fix.TableRef          { return []fix.TableRef{inputs.EndpointSlices} }
func (*localReader) Configure(map[string]any) error { return nil }
func (*localReader) Revert(context.Context) error   { return nil }
func (f *localReader) Ensure(_ context.Context, snap *fix.Snapshot, _ bool) (fix.Result, error) {
	f.local.Store(int32(inputs.LocalEndpoints(inputs.EndpointSlices.Get(snap), "default", "web", snap.Env.NodeName)))
	return fix.Result{}, nil
}

// A fix that reads EndpointSlices runs in the real engine with the agent's inputs (this module is
// one of them) and sees a new local endpoint; the slices are stripped, and LocalEndpoints counts
// only this node's ready endpoints of the Service.
func TestAFixReadsEndpointSlicesThroughTheEngine(t *testing.T) {
	cs := fake.NewClientset(slice("web-1", "web", "node-a", "node-b"), slice("other-1", "other", "node-a"))
	log := slog.New(slog.DiscardHandler)
	ins, err := builtin.All()
	if err != nil {
		t.Fatal(err)
	}
	c := config.Defaults()
	c.NodeName = "node-a"
	c.MinSyncPeriod = 10 * time.Millisecond
	f := &localReader{}
	e, err := engine.New(engine.Options{Fixes: []fix.Fix{f}, Backend: testkit.NewFakeBackend(), Config: &c, Env: fix.Env{NodeName: "node-a"},
		Hub: watch.NewHub(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "node-a", log), Inputs: ins,
		Metrics: metrics.NewSync(prometheus.NewRegistry()), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	agenttest.Until(t, 10*time.Second, func() bool { return f.local.Load() == 1 })
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(context.Background(), slice("web-2", "web", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	agenttest.Until(t, 10*time.Second, func() bool { return f.local.Load() == 2 })
	for _, s := range inputs.EndpointSlices.Get(e.Snapshot()) {
		if len(s.Labels) != 1 || s.Endpoints[0].Hints != nil {
			t.Errorf("%s not stripped: %+v", s.Name, s)
		}
	}
}
