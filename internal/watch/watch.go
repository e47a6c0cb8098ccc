// Package watch is the machinery the input modules share to fill their tables from the cluster: a
// Hub runs their informers on the agent's one API client (or on a file's objects, for `plan`),
// logs API errors once per cause, and carries one coalesced change signal to the engine. It knows no
// input: each table (fix.Table) is provided by an input module as an inputs.Input, and the Hub is the inputs.Source it fills it through.
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/waitgroup"
)

// Hub runs the inputs' informers. It does no I/O until an input starts one, and makes the API
// client only then, so an agent whose fixes read nothing needs no API server.
type Hub struct {
	newClient func() (kube.Interface, error)
	nodeName  string
	log       *slog.Logger
	changes   chan struct{}

	mu       sync.Mutex
	client   kube.Interface
	ctx      context.Context // the informers' context, cancelled by Stop
	cancel   context.CancelFunc
	stopped  bool
	started  time.Time // when the first informer started, for the "watches synced" log line
	synced   bool      // that line was logged
	watches  []started
	wg       sync.WaitGroup
	apiErrs  *apiErrorLog
	wrapped  atomic.Bool // WrapTransport is in the client's transport
	fileMode bool
	// hearing: when each watch last heard from the API server (Blind, nnm_watch_silence_seconds);
	// blindWatched: the goroutine that logs blindness runs.
	hearing      hearing
	blindWatched bool
}

// started is one informer the hub runs.
type started struct {
	r      kube.Resource
	store  cache.Store
	synced cache.InformerSynced
}

// NewHub returns a Hub on the client newClient makes (once, on first use). nodeName is this node's
// name ("" when not configured: inputs of this node's objects then cannot watch).
func NewHub(newClient func() (kube.Interface, error), nodeName string, log *slog.Logger) *Hub {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{newClient: newClient, nodeName: nodeName, log: log, changes: make(chan struct{}, 1),
		ctx: ctx, cancel: cancel, apiErrs: newAPIErrorLog(log), hearing: hearing{now: time.Now}}
}

// NodeName is this node's name, "" when unknown.
func (h *Hub) NodeName() string { return h.nodeName }

// Log is the agent's logger.
func (h *Hub) Log() *slog.Logger { return h.log }

// Client returns the API client, made on the first call.
func (h *Hub) Client() (kube.Interface, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.clientLocked()
}

func (h *Hub) clientLocked() (kube.Interface, error) {
	if h.stopped {
		return nil, fmt.Errorf("watch: stopped")
	}
	if h.client == nil {
		c, err := h.newClient()
		if err != nil {
			return nil, err
		}
		h.client = c
	}
	return h.client, nil
}

// Go runs f in the background until Stop, with the hub's context and client (e.g. a discovery that
// decides whether an informer can run).
func (h *Hub) Go(f func(ctx context.Context, api inputs.Discovery)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	client, err := h.clientLocked()
	if err != nil {
		return err
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f(h.ctx, client)
	}()
	return nil
}

// Changed signals the engine that some table changed; the input has moved its revision before.
func (h *Hub) Changed() {
	select {
	case h.changes <- struct{}{}:
	default:
	}
}

// Changes receives a value (coalesced) after any table changed.
func (h *Hub) Changes() <-chan struct{} { return h.changes }

// Stop ends the informers and whatever Go started, and waits for them, at most stopWait.
func (h *Hub) Stop() {
	h.mu.Lock()
	h.stopped = true
	h.mu.Unlock()
	h.cancel()
	if !waitgroup.Until(&h.wg, time.After(stopWait)) {
		// client-go's streaming list sleeps out its retry backoff (up to 30 s) without watching the
		// stop channel when the API server refuses connections; the process is ending anyway.
		h.log.Warn("watches still retrying the API server; not waiting for them", "after", stopWait)
	}
}

// stopWait bounds how long Stop waits for the informers to end.
const stopWait = 2 * time.Second

// ErrNoAPI is why the inputs of an Offline hub cannot start.
var ErrNoAPI = errors.New("no API client")

// Offline returns a Hub without an API client: its inputs cannot start (ErrNoAPI). For engines
// whose fixes read no table.
func Offline(log *slog.Logger) *Hub {
	return NewHub(func() (kube.Interface, error) { return nil, ErrNoAPI }, "", log)
}

var _ inputs.Source = (*Hub)(nil)
