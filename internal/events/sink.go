package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// The series timing of client-go's events/v1 broadcaster (k8s.io/client-go/tools/events).
const (
	// refreshTime: a series' count is written this often while it goes on.
	refreshTime = 30 * time.Minute
	// finishTime: a series without a new occurrence for this long has ended (its count is written
	// once more and it is forgotten); a single Event is forgotten after it.
	finishTime = 6 * time.Minute
	// maxTries and retryAfter bound the attempts to write one Event the API server did not answer.
	maxTries   = 12
	retryAfter = 10 * time.Second
	// queueLen bounds the writes waiting for the API server; more are dropped (and logged).
	queueLen = 1000
)

// sink writes Events to the API server the way client-go's events/v1 broadcaster does, which the
// agent does not link (it imports every API group's client; see package kube): an Event isomorphic
// to one written less than finishTime ago (same regarding object, reason, action, type, reporting
// controller and instance) is not created again. The second occurrence makes it a series (a patch
// of series.count to 2); later ones are counted in memory and written every refreshTime and when the
// series ends. Writes go out in order from one goroutine, so posting never waits for the API.
type sink struct {
	api                  kube.Interface
	controller, instance string
	log                  *slog.Logger
	now                  func() time.Time

	mu     sync.Mutex
	cache  map[seriesKey]*eventsv1.Event
	queue  chan *eventsv1.Event
	cancel context.CancelFunc
	done   chan struct{}
}

type seriesKey struct {
	regarding                 corev1.ObjectReference
	reason, action, eventType string
}

func newSink(api kube.Interface, controller string, log *slog.Logger) *sink {
	host, _ := os.Hostname()
	return &sink{api: api, controller: controller, instance: controller + "-" + host, log: log, now: time.Now,
		cache: map[seriesKey]*eventsv1.Event{}, queue: make(chan *eventsv1.Event, queueLen)}
}

// Eventf records an Event about regarding (a *corev1.ObjectReference); related is not used.
func (s *sink) Eventf(regarding, _ runtime.Object, eventType, reason, action, note string, args ...any) {
	ref, ok := regarding.(*corev1.ObjectReference)
	if !ok {
		s.log.Error("event about an object that is not an ObjectReference; dropped", "type", fmt.Sprintf("%T", regarding), "reason", reason)
		return
	}
	now := s.now()
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%v.%x", ref.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: s.controller, ReportingInstance: s.instance,
		Action: action, Reason: reason, Regarding: *ref, Note: fmt.Sprintf(note, args...), Type: eventType,
	}
	key := seriesKey{regarding: *ref, reason: reason, action: action, eventType: eventType}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, isomorphic := s.cache[key]
	switch {
	case !isomorphic:
		s.cache[key] = ev
		s.enqueue(ev.DeepCopy())
	case prev.Series != nil:
		prev.Series.Count++
		prev.Series.LastObservedTime = metav1.NewMicroTime(now)
	default:
		prev.Series = &eventsv1.EventSeries{Count: 2, LastObservedTime: metav1.NewMicroTime(now)}
		s.enqueue(prev.DeepCopy())
	}
}

// enqueue hands a write to the writer; s.mu is held.
func (s *sink) enqueue(ev *eventsv1.Event) {
	select {
	case s.queue <- ev:
	default:
		s.log.Warn("too many node events waiting for the API server; dropped one", "reason", ev.Reason, "action", ev.Action)
	}
}

// start runs the writer until stop.
func (s *sink) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		refresh, finish := time.NewTicker(refreshTime), time.NewTicker(finishTime)
		defer refresh.Stop()
		defer finish.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-s.queue:
				s.write(ctx, ev)
			case <-refresh.C:
				for _, ev := range s.series(false) {
					s.write(ctx, ev)
				}
			case <-finish.C:
				for _, ev := range s.series(true) {
					s.write(ctx, ev)
				}
			}
		}
	}()
}

// stop ends the writer; writes not done yet are dropped.
func (s *sink) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
}

// series returns copies of the series to write: every one (refresh), or those that ended, which it
// forgets, together with single Events older than finishTime (finish).
func (s *sink) series(finish bool) []*eventsv1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := s.now().Add(-finishTime)
	var out []*eventsv1.Event
	for k, ev := range s.cache {
		switch {
		case ev.Series == nil:
			if finish && ev.EventTime.Time.Before(cutoff) {
				delete(s.cache, k)
			}
		case !finish:
			out = append(out, ev.DeepCopy())
		case ev.Series.LastObservedTime.Time.Before(cutoff):
			out = append(out, ev.DeepCopy())
			delete(s.cache, k)
		}
	}
	return out
}

// write creates ev, or patches its series, retrying while the API server does not answer.
func (s *sink) write(ctx context.Context, ev *eventsv1.Event) {
	for try := 1; ; try++ {
		err := s.record(ctx, ev)
		if err == nil {
			return
		}
		if !retriable(err) || try == maxTries {
			s.log.Warn("cannot write a node event; dropped", "reason", ev.Reason, "action", ev.Action, "tries", try, "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryAfter):
		}
	}
}

func (s *sink) record(ctx context.Context, ev *eventsv1.Event) error {
	var err error
	if ev.Series != nil {
		var patch []byte
		if patch, err = json.Marshal(struct {
			Series *eventsv1.EventSeries `json:"series"`
		}{ev.Series}); err != nil {
			return err
		}
		_, err = s.api.PatchEvent(ctx, ev.Namespace, ev.Name, types.StrategicMergePatchType, patch)
	}
	// The series' Event may have been deleted (Events expire): create it again.
	if ev.Series == nil || apierrors.IsNotFound(err) {
		ev.ResourceVersion = ""
		_, err = s.api.CreateEvent(ctx, ev)
	}
	return err
}

// retriable: the API server did not answer, was overloaded or failed; not an answer about the Event
// itself (invalid, already exists, forbidden).
func retriable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	code := status.Status().Code
	return code == 429 || code >= 500
}
