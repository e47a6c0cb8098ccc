package events

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
)

// The series timing of the sink, step by step (no writer goroutine): the third occurrence is only
// counted, a refresh writes the count, the end of the series writes it once more and forgets it (the
// next occurrence is a new Event), and a series whose Event was deleted is created again.
func TestSinkSeries(t *testing.T) {
	cs := fake.NewClientset()
	s := newSink(kubetest.From(cs), Controller, quietLog())
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	ctx := context.Background()
	node := &corev1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"}
	drain := func() (n int) {
		for {
			select {
			case ev := <-s.queue:
				s.write(ctx, ev)
				n++
			default:
				return n
			}
		}
	}
	get := func(name string) (int32, bool) {
		ev, err := cs.EventsV1().Events("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return 0, false
		}
		if ev.Series == nil {
			return 1, true
		}
		return ev.Series.Count, true
	}
	for range 3 {
		s.Eventf(node, nil, corev1.EventTypeWarning, FixSyncFailed, "x", "%s", "boom")
		now = now.Add(time.Second)
	}
	if n := drain(); n != 2 {
		t.Fatalf("3 occurrences made %d writes, want 2 (create, series of 2)", n)
	}
	name := "node-a.38d7ea4c68000" // the first occurrence: 1e6 s in nanoseconds, hexadecimal
	if c, ok := get(name); !ok || c != 2 {
		t.Fatalf("after 3 occurrences: count %d (found %v), want 2", c, ok)
	}
	for _, ev := range s.series(false) {
		s.write(ctx, ev)
	}
	if c, _ := get(name); c != 3 {
		t.Fatalf("after a refresh: count %d, want 3", c)
	}
	s.Eventf(node, nil, corev1.EventTypeWarning, FixSyncFailed, "x", "%s", "boom")
	if err := cs.EventsV1().Events("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ended := s.series(true); len(ended) != 0 {
		t.Fatalf("a series seen a second ago ended: %d", len(ended))
	}
	now = now.Add(finishTime + time.Second)
	ended := s.series(true)
	if len(ended) != 1 {
		t.Fatalf("want the series to end, got %d", len(ended))
	}
	s.write(ctx, ended[0])
	if c, ok := get(name); !ok || c != 4 {
		t.Fatalf("the ended series whose Event was deleted: count %d (found %v), want it created again with 4", c, ok)
	}
	s.Eventf(node, nil, corev1.EventTypeWarning, FixSyncFailed, "x", "%s", "boom")
	if n := drain(); n != 1 || len(s.cache) != 1 {
		t.Fatalf("after the series ended: %d writes, %d cached; want a new Event", n, len(s.cache))
	}
}
