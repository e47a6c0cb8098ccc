package watch

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// Informer runs an informer of r (only the objects fieldSelector selects) until Stop: transform
// makes what its cache holds of each object (nil: the object as it is), and handler hears every
// change, after the cache has it. It returns the cache and whether the handler has seen the first
// list. The informer has no namespace index: nothing here looks objects up by namespace, and at
// 10,000 Services the index costs more than the compact objects' addresses.
func (h *Hub) Informer(r kube.Resource, fieldSelector string, transform cache.TransformFunc,
	handler cache.ResourceEventHandler) (cache.Store, cache.InformerSynced, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	client, err := h.clientLocked()
	if err != nil {
		return nil, nil, err
	}
	lw := h.hearing.add(r.Name).listWatch(client.ListWatch(r, fieldSelector))
	inf := cache.NewSharedIndexInformerWithOptions(lw, r.New(), cache.SharedIndexInformerOptions{})
	if transform != nil {
		if err := inf.SetTransform(transform); err != nil {
			return nil, nil, err
		}
	}
	if err := inf.SetWatchErrorHandlerWithContext(h.watchError()); err != nil {
		return nil, nil, err
	}
	reg, err := inf.AddEventHandler(handler)
	if err != nil {
		return nil, nil, err
	}
	if h.started.IsZero() {
		h.started = time.Now()
	}
	if !h.blindWatched {
		h.blindWatched = true
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.watchBlind()
		}()
	}
	// Synced once the handler, not only the store, has seen the first list: inputs build their
	// tables from the handler's events.
	h.watches = append(h.watches, started{r: r, store: inf.GetStore(), synced: reg.HasSynced})
	h.synced = false
	h.wg.Add(2)
	go func() {
		defer h.wg.Done()
		inf.Run(h.ctx.Done())
	}()
	go func() {
		defer h.wg.Done()
		if cache.WaitForCacheSync(h.ctx.Done(), reg.HasSynced) {
			h.logSynced()
		}
	}()
	return inf.GetStore(), reg.HasSynced, nil
}

// logSynced logs, once, how long the first list of the started informers took (at 10,000 Services
// this is a large part of a cold start; see BENCHMARKS.md), when every one of them has it, with the
// number of objects of each resource ("services=10000").
func (h *Hub) logSynced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.synced {
		return
	}
	args := []any{"after", time.Since(h.started).Round(time.Millisecond)}
	for _, w := range h.watches {
		if !w.synced() {
			return
		}
		args = append(args, w.r.Name, len(w.store.ListKeys()))
	}
	h.synced = true
	h.log.Info("watches synced", args...)
}

// ReportAPIError logs an API error under key, rate-limited (APIErrorLogEvery). Errors of requests
// that got no answer at all are left out when WrapTransport logs them (TransportLogs).
func (h *Hub) ReportAPIError(key, msg string, args ...any) { h.apiErrs.report(key, msg, args...) }

// TransportLogs reports whether WrapTransport logs the requests that got no answer.
func (h *Hub) TransportLogs() bool { return h.wrapped.Load() }

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
func (h *Hub) watchError() cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, r *cache.Reflector, err error) {
		var uerr *url.Error
		if h.wrapped.Load() && errors.As(err, &uerr) {
			return
		}
		h.apiErrs.report(r.TypeDescription(), "cannot list or watch the API; retrying", "watch", r.TypeDescription(), "err", err)
	}
}

// WrapTransport (for rest.Config.Wrap) logs the API requests that got no answer (API server
// unreachable, connection refused, TLS failure) with their cause, and those the API server
// throttled (429), each rate-limited under a key of its own. client-go's streaming list
// (WatchListClient) retries both without handing the error to the watch error handler, so an API
// server that is down at start, or throttles the agent, shows only here.
func (h *Hub) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	h.wrapped.Store(true)
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		request := req.Method + " " + req.URL.Path
		switch {
		case err != nil && req.Context().Err() == nil:
			h.apiErrs.report("connection", "cannot reach the API server; retrying", "request", request, "err", err)
		case err == nil && resp.StatusCode == http.StatusTooManyRequests:
			h.apiErrs.report("throttled", "the API server throttles the agent (429 Too Many Requests); retrying",
				"request", request, "retryAfter", resp.Header.Get("Retry-After"))
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
