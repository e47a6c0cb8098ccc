package watch

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// A watch hears the API server while its stream is open and when a list is answered; it is silent
// between streams, and the hub is blind once a watch has been silent for longer than BlindAfter.
func TestSilenceAndBlind(t *testing.T) {
	now := time.Unix(1000, 0)
	h := &Hub{hearing: hearing{now: func() time.Time { return now }}}
	fw := watch.NewFake()
	listErr := errors.New("connection refused")
	lw := h.hearing.add("services").listWatch(&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.ServiceList{}, listErr
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return fw, nil },
	}).(cache.ListerWatcherWithContext)
	ctx := context.Background()
	silence := func() time.Duration { return h.hearing.silences()["services"] }

	now = now.Add(10 * time.Second)
	if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); err == nil || silence() != 10*time.Second {
		t.Fatalf("a failed list: silence %v, want 10s (since the watch was added)", silence())
	}
	listErr = nil
	if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); err != nil || silence() != 0 {
		t.Fatalf("an answered list: silence %v, want 0", silence())
	}
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if silence() != 0 || h.Blind() != nil {
		t.Fatalf("an open stream an hour on: silence %v, blind %v; want 0 and nil", silence(), h.Blind())
	}
	go fw.Add(&corev1.Service{})
	if ev := <-w.ResultChan(); ev.Type != watch.Added {
		t.Fatalf("event %v, want Added relayed", ev.Type)
	}
	fw.Stop() // the API server goes: the stream ends
	for range w.ResultChan() {
	}
	now = now.Add(BlindAfter)
	if silence() != BlindAfter || h.Blind() != nil {
		t.Fatalf("silent for BlindAfter: silence %v, blind %v; want BlindAfter and not blind yet", silence(), h.Blind())
	}
	now = now.Add(time.Second)
	var be *BlindError
	if err := h.Blind(); !errors.As(err, &be) || !errors.Is(err, ErrBlind) || be.Silence != BlindAfter+time.Second || len(be.Resources) != 1 {
		t.Fatalf("silent for BlindAfter + 1 s: %v, want a BlindError naming services", err)
	}
}
