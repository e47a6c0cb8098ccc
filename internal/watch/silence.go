package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"

	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// BlindAfter is how long the watches may go without hearing from the API server before the agent
// is blind: not ready (Hub.Blind), and logged. A watch hears the API server while its stream is
// open (client-go's HTTP/2 health check closes a connection that stops answering its pings within
// 45 s) and when a list is answered; between two streams it is silent. A watch that the API server
// ends (every 5-10 minutes) is open again within a second; one that cannot reach it retries with
// client-go's reflector backoff, which grows to 30 s: a watch silent for that long has failed its
// retries for a while, and the changes made meanwhile reach the kernel only once it hears again
// (issue #63: 42-45 s after five restarts of the API server, with /readyz 200 all along).
const BlindAfter = 30 * time.Second

// blindCheckEvery is how often the hub looks whether it turned blind or hears again, for the log.
const blindCheckEvery = time.Second

// hearing is when each watch of a hub last heard from the API server.
type hearing struct {
	now func() time.Time

	mu      sync.Mutex
	watches []*heard
	blind   bool // the last check found the hub blind (logged)
	since   time.Time
}

// heard is one watch: how many streams it has open, and when it last heard.
type heard struct {
	h        *hearing
	resource string
	open     int
	last     time.Time
}

func (h *hearing) add(resource string) *heard {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := &heard{h: h, resource: resource, last: h.now()}
	h.watches = append(h.watches, w)
	return w
}

func (w *heard) hear() {
	w.h.mu.Lock()
	w.last = w.h.now()
	w.h.mu.Unlock()
}

func (w *heard) opened(delta int) {
	w.h.mu.Lock()
	w.open += delta
	w.last = w.h.now()
	w.h.mu.Unlock()
}

// silence is how long w has not heard (0 while a stream is open). Called with h.mu held.
func (w *heard) silence(now time.Time) time.Duration {
	if w.open > 0 {
		return 0
	}
	return now.Sub(w.last)
}

// silences is each watch's silence by resource (the longest when several watch one resource).
func (h *hearing) silences() map[string]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	out := map[string]time.Duration{}
	for _, w := range h.watches {
		out[w.resource] = max(out[w.resource], w.silence(now))
	}
	return out
}

// listWatch is lw, telling w when it hears the API server: a list answered, a watch stream opened,
// each event on it (bookmarks included), and its end.
func (w *heard) listWatch(lw cache.ListerWatcher) cache.ListerWatcher {
	inner := cache.ToListerWatcherWithContext(lw)
	return &heardListWatch{unsupported: watchlist.DoesClientNotSupportWatchListSemantics(lw), ListWatch: cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			obj, err := inner.ListWithContext(ctx, opts)
			if err == nil {
				w.hear()
			}
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := inner.WatchWithContext(ctx, opts)
			if err != nil {
				return nil, err
			}
			return newHeardWatch(wi, w), nil
		},
	}}
}

// heardListWatch is heard's ListWatch. It says whether the lister-watcher it wraps supports
// client-go's streaming lists (a fake or a file's does not): the reflector asks.
type heardListWatch struct {
	cache.ListWatch
	unsupported bool
}

func (l *heardListWatch) IsWatchListSemanticsUnSupported() bool { return l.unsupported }

// heardWatch relays a watch stream's events, telling heard about them and about the stream's end.
type heardWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func newHeardWatch(inner watch.Interface, w *heard) *heardWatch {
	hw := &heardWatch{inner: inner, out: make(chan watch.Event), stop: make(chan struct{})}
	w.opened(1)
	go func() {
		defer close(hw.out)
		defer w.opened(-1)
		for ev := range inner.ResultChan() {
			w.hear()
			select {
			case hw.out <- ev:
			case <-hw.stop:
				return
			}
		}
	}()
	return hw
}

func (hw *heardWatch) ResultChan() <-chan watch.Event { return hw.out }

func (hw *heardWatch) Stop() {
	hw.once.Do(func() {
		close(hw.stop)
		hw.inner.Stop()
	})
}

// BlindError is Blind's error: the watches that have not heard from the API server for longer
// than BlindAfter.
type BlindError struct {
	// Silence is the longest silence; Resources the watches silent for longer than BlindAfter.
	Silence   time.Duration
	Resources []string
}

func (e *BlindError) Error() string {
	return fmt.Sprintf("the watches of %s have not heard from the API server for %s (limit %s): changes made meanwhile are not seen",
		strings.Join(e.Resources, ", "), e.Silence.Round(time.Second), BlindAfter)
}

// Short is the error as the unauthenticated probes show it (it holds no detail to hide).
func (e *BlindError) Short() string { return e.Error() }

// ErrBlind is wrapped by BlindError.
var ErrBlind = errors.New("the watches do not hear the API server")

func (e *BlindError) Unwrap() error { return ErrBlind }

// Blind returns a *BlindError when a watch of the hub has not heard from the API server for longer
// than BlindAfter, else nil: a readiness input (/readyz, nnm_agent_ready). A hub that watches
// nothing is never blind.
func (h *Hub) Blind() error {
	var e *BlindError
	for r, s := range h.hearing.silences() {
		if s <= BlindAfter {
			continue
		}
		if e == nil {
			e = &BlindError{}
		}
		e.Silence = max(e.Silence, s)
		e.Resources = append(e.Resources, r)
	}
	if e == nil {
		return nil
	}
	slices.Sort(e.Resources)
	return e
}

// checkBlind logs when the hub turns blind (Blind) and when every watch hears again, with how long
// it was blind.
func (h *Hub) checkBlind(log *slog.Logger) {
	err := h.Blind()
	hr := &h.hearing
	hr.mu.Lock()
	was, since := hr.blind, hr.since
	hr.blind = err != nil
	if err != nil && !was {
		var be *BlindError
		errors.As(err, &be)
		hr.since = hr.now().Add(-be.Silence)
	}
	hr.mu.Unlock()
	switch {
	case err != nil && !was:
		log.Warn("blind: the watches do not hear the API server; changes made meanwhile reach the kernel only once they do, and the agent is not ready", "err", err)
	case err == nil && was:
		log.Info("the watches hear the API server again", "blindFor", time.Since(since).Round(time.Second))
	}
}

// watchBlind runs checkBlind until the hub stops.
func (h *Hub) watchBlind() {
	t := time.NewTicker(blindCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
			h.checkBlind(h.log)
		}
	}
}

// silenceDesc is nnm_watch_silence_seconds.
var silenceDesc = prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, "watch", "silence_seconds"),
	fmt.Sprintf("Seconds since the watch of resource last heard from the API server: 0 while its stream is open, growing while it cannot list or watch. Above %v the agent is not ready (/readyz).", BlindAfter),
	[]string{"resource"}, nil)

// SilenceCollector exports nnm_watch_silence_seconds of the hub's watches, read at each scrape.
func (h *Hub) SilenceCollector() prometheus.Collector { return silenceCollector{h} }

type silenceCollector struct{ h *Hub }

func (c silenceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- silenceDesc }

func (c silenceCollector) Collect(ch chan<- prometheus.Metric) {
	for r, s := range c.h.hearing.silences() {
		ch <- prometheus.MustNewConstMetric(silenceDesc, prometheus.GaugeValue, s.Seconds(), r)
	}
}
