package watch_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/builtin"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/inputs/pods"
	"github.com/network-node-manager/network-node-manager/internal/inputs/servicecidrs"
	"github.com/network-node-manager/network-node-manager/internal/inputs/services"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// needs picks the built-in inputs a test starts.
type needs struct{ Services, Node, Pods, ServiceCIDRs bool }

// informers is a Hub with the built-in inputs, started by needs: the view the engine has of them.
type informers struct {
	hub   *watch.Hub
	svc   *services.Input
	node  *node.Input
	pods  *pods.Input
	cidrs *servicecidrs.Input

	mu      sync.Mutex
	started needs
}

func newInformers(newClient func() (kube.Interface, error), nodeName string, log *slog.Logger) *informers {
	s := &informers{hub: watch.NewHub(newClient, nodeName, log), svc: services.New(), node: node.New(), pods: pods.New(), cidrs: servicecidrs.New()}
	c := config.Defaults()
	s.cidrs.Configure(engine.InputSettings(&c))
	return s
}

func (s *informers) ins(n needs) []inputs.Input {
	var out []inputs.Input
	for _, x := range []struct {
		on bool
		in inputs.Input
	}{{n.Services, s.svc}, {n.Node, s.node}, {n.Pods, s.pods}, {n.ServiceCIDRs, s.cidrs}} {
		if x.on {
			out = append(out, x.in)
		}
	}
	return out
}

func (s *informers) Start(_ context.Context, n needs) error {
	for _, in := range s.ins(n) {
		if err := in.Start(s.hub); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = needs{s.started.Services || n.Services, s.started.Node || n.Node, s.started.Pods || n.Pods, s.started.ServiceCIDRs || n.ServiceCIDRs}
	return nil
}

func (s *informers) Started() needs {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

func (s *informers) NeedsSynced(n needs) error {
	var missing []string
	for _, in := range s.ins(n) {
		if err := in.Synced(); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return errors.New("watches not synced: " + strings.Join(missing, ", "))
	}
	return nil
}

func (s *informers) WaitForNeeds(ctx context.Context, n needs) error {
	for {
		err := s.NeedsSynced(n)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *informers) WaitForSync(ctx context.Context) error { return s.WaitForNeeds(ctx, s.Started()) }
func (s *informers) Services() []*fix.Service              { return s.svc.Value().([]*fix.Service) }
func (s *informers) Node() *corev1.Node                    { return s.node.Value().(*corev1.Node) }
func (s *informers) Pods() []*corev1.Pod                   { return s.pods.Value().([]*corev1.Pod) }
func (s *informers) Changes() <-chan struct{}              { return s.hub.Changes() }
func (s *informers) Stop()                                 { s.hub.Stop() }

// Version is the sum of the revisions of what n reads.
func (s *informers) Version(n needs) uint64 {
	var v uint64
	for _, in := range s.ins(n) {
		v += in.Revision()
	}
	return v
}

// fileView starts every input on a hub over f and waits for them.
func fileView(t *testing.T, f *watch.File) *informers {
	t.Helper()
	s := newInformers(func() (kube.Interface, error) { return f, nil }, f.NodeName, slog.New(slog.DiscardHandler))
	all := needs{true, true, true, true}
	if f.NodeName == "" {
		all.Pods = false
	}
	if err := s.Start(context.Background(), all); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitForNeeds(ctx, all); err != nil {
		t.Fatal(err)
	}
	return s
}

// resources are the kinds the agent's inputs watch.
func resources(t *testing.T) []kube.Resource {
	t.Helper()
	ins, err := builtin.All()
	if err != nil {
		t.Fatal(err)
	}
	var out []kube.Resource
	for _, in := range ins {
		if w, ok := in.(inputs.Watcher); ok {
			out = append(out, w.Resources()...)
		}
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
