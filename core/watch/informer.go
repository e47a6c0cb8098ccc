package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/kube"
	"github.com/network-node-manager/network-node-manager/internal/waitgroup"
)

// Informers is a Source backed by client-go shared informers: Services cluster-wide and this node's
// Node object (field selector metadata.name, so only one Node is ever listed).
type Informers struct {
	newClient func() (kube.Interface, error)
	nodeName  string
	log       *slog.Logger

	changes chan struct{}
	// versions count the changes signalled, per watch (Version).
	versions struct{ services, node, pods, serviceCIDRs atomic.Uint64 }

	mu          sync.Mutex
	client      kube.Interface  // made by the first Start that needs a watch
	ctx         context.Context // the informers' context, cancelled by Stop
	cancel      context.CancelFunc
	stopped     bool
	startedOnce bool // some watch was started (later starts are logged)
	wg          sync.WaitGroup
	svcStore    cache.Store
	svcSync     cache.InformerSynced
	services    sortedServices // the Services of svcStore's events, sorted
	nodeStore   cache.Store
	nodeSync    cache.InformerSynced
	podStore    cache.Store
	podSync     cache.InformerSynced
	cidrs       serviceCIDRWatch
	started     time.Time // when Start began, for the "watches synced" log line
	synced      bool      // that line was logged

	apiErrors        *apiErrorLog
	transportWrapped atomic.Bool // WrapTransport is in the client's transport
}

// NewInformers returns an informer Source. It does no I/O until Start, and creates the client only
// if some running fix needs a watch, so an agent whose fixes read nothing needs no API server.
func NewInformers(newClient func() (kube.Interface, error), nodeName string, log *slog.Logger) *Informers {
	return &Informers{newClient: newClient, nodeName: nodeName, log: log, changes: make(chan struct{}, 1),
		apiErrors: newAPIErrorLog(log)}
}

// Start starts the informers that needs asks for and that are not running yet: a second call (a
// reload enabled a fix that reads another watch) adds what is missing. The informers live until Stop,
// under the context of the first call that started one.
func (s *Informers) Start(ctx context.Context, needs fix.Needs) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started.IsZero() {
		s.started = time.Now()
	}
	if s.stopped {
		return fmt.Errorf("watch: stopped")
	}
	missing := fix.Needs{Services: needs.Services && s.svcSync == nil, Node: needs.Node && s.nodeSync == nil,
		Pods: needs.Pods && s.podSync == nil, ServiceCIDRs: needs.ServiceCIDRs && !s.cidrs.started}
	if s.nodeName == "" && (missing.Node || missing.Pods) {
		if missing.Node {
			s.log.Warn("no node name configured: pod CIDRs come from the configuration only (set nodeName / NNM_NODE_NAME)")
		}
		if missing.Pods {
			s.log.Warn("no node name configured: this node's Pods cannot be watched (set nodeName / NNM_NODE_NAME)")
		}
		missing.Node, missing.Pods = false, false
	}
	if missing == (fix.Needs{}) {
		return nil
	}
	if s.client == nil {
		client, err := s.newClient()
		if err != nil {
			return err
		}
		s.client = client
	}
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(ctx)
	}
	client := s.client
	// handler signals every change of a watch whose version is v.
	handler := func(v *atomic.Uint64) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.notify(v) },
			UpdateFunc: func(old, cur any) { s.notify(v) },
			DeleteFunc: func(any) { s.notify(v) },
		}
	}
	if missing.Services {
		inf := newInformer(client, kube.Services, "")
		v := &s.versions.services
		svcHandler := cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.services.set(obj, false); s.notify(v) },
			UpdateFunc: func(_, cur any) { s.services.set(cur, false); s.notify(v) },
			DeleteFunc: func(obj any) { s.services.set(obj, true); s.notify(v) },
		}
		if err := s.start(s.ctx, inf, svcHandler, &s.svcStore, &s.svcSync); err != nil {
			return err
		}
	}
	if missing.Node {
		inf := newInformer(client, kube.Nodes, fields.OneTermEqualSelector("metadata.name", s.nodeName).String())
		if err := s.start(s.ctx, inf, handler(&s.versions.node), &s.nodeStore, &s.nodeSync); err != nil {
			return err
		}
	}
	if missing.Pods {
		// Only this node's Pods: the API server filters by spec.nodeName, as the kubelet's watch does.
		inf := newInformer(client, kube.Pods, fields.OneTermEqualSelector("spec.nodeName", s.nodeName).String())
		if err := s.start(s.ctx, inf, handler(&s.versions.pods), &s.podStore, &s.podSync); err != nil {
			return err
		}
	}
	if missing.ServiceCIDRs {
		s.cidrs.started = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watchServiceCIDRs(s.ctx, client, handler(&s.versions.serviceCIDRs))
		}()
	}
	if !s.startedOnce {
		s.startedOnce = true
	} else {
		s.log.Info("started the watches a newly enabled fix reads", "services", missing.Services, "node", missing.Node, "pods", missing.Pods,
			"serviceCIDRs", missing.ServiceCIDRs)
	}
	return nil
}

// Started reports which watches run: a need with no watch started (no node name for the Node and
// Pods) is false.
func (s *Informers) Started() fix.Needs {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fix.Needs{Services: s.svcSync != nil, Node: s.nodeSync != nil, Pods: s.podSync != nil, ServiceCIDRs: s.cidrs.started}
}

// newInformer returns an informer of r (only the objects fieldSelector selects), without the
// namespace index client-go's informer factory adds: nothing here looks objects up by namespace, and
// at 10,000 Services the index costs more than the compact objects' addresses.
func newInformer(client kube.Interface, r kube.Resource, fieldSelector string) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformerWithOptions(client.ListWatch(r, fieldSelector), r.Example(), cache.SharedIndexInformerOptions{})
}

// start strips what the informer caches, hooks the change signal in, and runs it in the background.
func (s *Informers) start(ctx context.Context, inf cache.SharedIndexInformer, h cache.ResourceEventHandler,
	store *cache.Store, synced *cache.InformerSynced) error {
	if err := inf.SetTransform(transform); err != nil {
		return err
	}
	if err := inf.SetWatchErrorHandlerWithContext(s.watchError()); err != nil {
		return err
	}
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		return err
	}
	// Synced once the handler, not only the store, has seen the first list: Services() is built
	// from the handler's events.
	*store, *synced = inf.GetStore(), reg.HasSynced
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		inf.Run(ctx.Done())
	}()
	return nil
}

// APIErrorLogEvery bounds how often API errors are logged: per cause (the connection to the API
// server, or one watch's list and watch), the first at once, then at most once per APIErrorLogEvery,
// counting those left out. client-go retries with its own backoff.
const APIErrorLogEvery = 30 * time.Second

// apiErrorLog logs API errors, rate-limited per key (see APIErrorLogEvery).
type apiErrorLog struct {
	log   *slog.Logger
	every time.Duration

	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func newAPIErrorLog(log *slog.Logger) *apiErrorLog {
	return &apiErrorLog{log: log, every: APIErrorLogEvery, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

func (l *apiErrorLog) report(key, msg string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if last, ok := l.last[key]; ok && now.Sub(last) < l.every {
		l.suppressed[key]++
		return
	}
	l.log.Error(msg, append(args, "suppressed", l.suppressed[key])...)
	l.last[key], l.suppressed[key] = now, 0
}

// watchError logs list and watch failures with their cause (unauthorized, forbidden, ...). Requests
// that got no answer at all are logged by WrapTransport when the client uses it, not twice here.
func (s *Informers) watchError() cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, r *cache.Reflector, err error) {
		var uerr *url.Error
		if s.transportWrapped.Load() && errors.As(err, &uerr) {
			return
		}
		s.apiErrors.report(r.TypeDescription(), "cannot list or watch the API; retrying", "watch", r.TypeDescription(), "err", err)
	}
}

// WrapTransport (for rest.Config.Wrap) logs the API requests that got no answer (API server
// unreachable, connection refused, TLS failure) with their cause, and those the API server
// throttled (429), each rate-limited under a key of its own. client-go's streaming list
// (WatchListClient) retries both without handing the error to the watch error handler, so an API
// server that is down at start, or throttles the agent, shows only here.
func (s *Informers) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	s.transportWrapped.Store(true)
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		request := req.Method + " " + req.URL.Path
		switch {
		case err != nil && req.Context().Err() == nil:
			s.apiErrors.report("connection", "cannot reach the API server; retrying", "request", request, "err", err)
		case err == nil && resp.StatusCode == http.StatusTooManyRequests:
			s.apiErrors.report("throttled", "the API server throttles the agent (429 Too Many Requests); retrying",
				"request", request, "retryAfter", resp.Header.Get("Retry-After"))
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Service:
		return (*cachedService)(fix.ServiceFrom(o)), nil
	case *corev1.Node:
		return StripNode(o), nil
	case *corev1.Pod:
		return StripPod(o), nil
	case *networkingv1.ServiceCIDR:
		return StripServiceCIDR(o), nil
	}
	return obj, nil
}

// notify signals a change of what the source holds and moves the version v of the watch that
// changed; the caches are updated before it is called.
func (s *Informers) notify(v *atomic.Uint64) {
	v.Add(1)
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

// WaitForSync waits for the started informers' first list.
func (s *Informers) WaitForSync(ctx context.Context) error {
	return s.WaitForNeeds(ctx, s.Started())
}

// WaitForNeeds waits for the first list of the watches that needs asks for, so a fix that reads
// only the Node does not wait for the Services.
func (s *Informers) WaitForNeeds(ctx context.Context, needs fix.Needs) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.NeedsSynced(needs)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("watch: %w: %w", err, ctx.Err())
		case <-tick.C:
		}
	}
}

// NeedsSynced returns nil when every watch that needs asks for has its first list, else why not: a
// watch not started (Start was not asked for it, or no node name for the Pods) or not synced yet.
// The Node without a node name is the one exception: it cannot be watched, and pod CIDRs then come
// from the configuration.
func (s *Informers) NeedsSynced(needs fix.Needs) error {
	s.mu.Lock()
	type watch struct {
		name   string
		need   bool
		synced cache.InformerSynced
	}
	watches := []watch{{"Services", needs.Services, s.svcSync}, {"Node", needs.Node && s.nodeName != "", s.nodeSync},
		{"Pods", needs.Pods, s.podSync}}
	if needs.ServiceCIDRs {
		var synced cache.InformerSynced
		if s.cidrs.started {
			synced = s.serviceCIDRsSynced
		}
		watches = append(watches, watch{"ServiceCIDRs", true, synced})
	}
	s.mu.Unlock()
	var missing []string
	for _, w := range watches {
		switch {
		case !w.need:
		case w.synced == nil && w.name == "Pods" && s.nodeName == "":
			missing = append(missing, "Pods (no node name)")
		case w.synced == nil:
			missing = append(missing, w.name+" (not started)")
		case !w.synced():
			missing = append(missing, w.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("watches not synced: %s", strings.Join(missing, ", "))
	}
	s.logSynced()
	return nil
}

// logSynced logs, once, how long the first list of the started informers took (at 10,000 Services
// this is a large part of a cold start; see BENCHMARKS.md), when every one of them has it: a fix
// that reads only the Node is ready before the Services are listed, and the line must not say the
// watches synced then.
func (s *Informers) logSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced {
		return
	}
	n := 0
	for _, synced := range []cache.InformerSynced{s.svcSync, s.nodeSync, s.podSync} {
		switch {
		case synced == nil:
		case !synced():
			return
		default:
			n++
		}
	}
	if s.cidrs.started && !s.serviceCIDRsSynced() {
		return
	}
	if n == 0 {
		return
	}
	s.synced = true
	services := 0
	if s.svcStore != nil {
		services = len(s.svcStore.ListKeys())
	}
	s.log.Info("watches synced", "after", time.Since(s.started).Round(time.Millisecond), "services", services)
}

// Services returns the cached Services, sorted. The slice and the objects are shared: do not modify.
func (s *Informers) Services() []*fix.Service { return s.services.list() }

// Node returns this node's Node object.
func (s *Informers) Node() *corev1.Node {
	s.mu.Lock()
	store := s.nodeStore
	s.mu.Unlock()
	if store == nil {
		return nil
	}
	o, ok, _ := store.GetByKey(s.nodeName)
	if !ok {
		return nil
	}
	return o.(*corev1.Node)
}

// Pods returns this node's Pods from the cache, sorted. The objects are shared: do not modify.
func (s *Informers) Pods() []*corev1.Pod {
	s.mu.Lock()
	store := s.podStore
	s.mu.Unlock()
	if store == nil {
		return nil
	}
	var out []*corev1.Pod
	for _, o := range store.List() {
		if p, ok := o.(*corev1.Pod); ok {
			out = append(out, p)
		}
	}
	SortPods(out)
	return out
}

// Changes signals changes.
func (s *Informers) Changes() <-chan struct{} { return s.changes }

// Version implements Versioned: the sum of the change counts of the watches needs reads and the
// Node's.
func (s *Informers) Version(needs fix.Needs) uint64 {
	v := s.versions.node.Load()
	if needs.Services {
		v += s.versions.services.Load()
	}
	if needs.Pods {
		v += s.versions.pods.Load()
	}
	if needs.ServiceCIDRs {
		v += s.versions.serviceCIDRs.Load()
	}
	return v
}

// Stop stops the informers and waits for them, at most stopWait.
func (s *Informers) Stop() {
	s.mu.Lock()
	cancel := s.cancel
	s.stopped = true
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if !waitgroup.Until(&s.wg, time.After(stopWait)) {
		// client-go's streaming list sleeps out its retry backoff (up to 30 s) without watching the
		// stop channel when the API server refuses connections; the process is ending anyway.
		s.log.Warn("watches still retrying the API server; not waiting for them", "after", stopWait)
	}
}

// stopWait bounds how long Stop waits for the informers to end.
const stopWait = 2 * time.Second
