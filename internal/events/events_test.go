package events

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	k8sevents "k8s.io/client-go/tools/events"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
)

var _ engine.Notifier = (*Recorder)(nil)

// Nop (a nil *Recorder) posts nothing, starts and stops.
func TestNop(t *testing.T) {
	r := Nop()
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.FixEnabled("x")
	r.FixSyncFailed("x", errors.New("e"))
	r.ConfigRejected(errors.New("e"))
	r.PredecessorTakenOver(1, nil)
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The limiter lets Burst events of one subject through in any Window, counts the rest, and says how
// many it suppressed when the next one passes; subjects are independent.
func TestLimiterBound(t *testing.T) {
	l := limiter{burst: Burst, window: Window}
	t0 := time.Unix(1000, 0)
	passed := 0
	for i := range 100 {
		// A storm: 100 events in 50 seconds.
		if ok, _ := l.allow("FixSyncFailed/a", t0.Add(time.Duration(i)*500*time.Millisecond)); ok {
			passed++
		}
	}
	if passed != Burst {
		t.Fatalf("a storm of 100 in 50s let %d through, want %d", passed, Burst)
	}
	if ok, _ := l.allow("FixSyncFailed/b", t0.Add(10*time.Second)); !ok {
		t.Fatal("another fix's subject was limited by the storm of the first")
	}
	// The oldest passed at t0: a minute later one slot is free, and it reports the suppressed ones.
	ok, suppressed := l.allow("FixSyncFailed/a", t0.Add(Window))
	if !ok || suppressed != 100-Burst {
		t.Fatalf("a window later: ok=%v suppressed=%d, want true %d", ok, suppressed, 100-Burst)
	}
	if ok, _ := l.allow("FixSyncFailed/a", t0.Add(Window)); ok {
		t.Fatal("the other two slots are still taken (they passed at t0+0.5s and t0+1s)")
	}
	// Over a long storm (one event a second for 10 minutes), no window of a minute holds more than
	// Burst events.
	var times []time.Time
	for i := range 600 {
		now := t0.Add(time.Hour + time.Duration(i)*time.Second)
		if ok, _ := l.allow("ConfigReloadRejected/ReloadConfig", now); ok {
			times = append(times, now)
		}
	}
	for i := range times {
		if i+Burst < len(times) && times[i+Burst].Sub(times[i]) < Window {
			t.Fatalf("%d events within %s: %v", Burst+1, times[i+Burst].Sub(times[i]), times[i:i+Burst+1])
		}
	}
	if len(times) < 10*Burst {
		t.Fatalf("a 10-minute storm let only %d through; the limit must still report", len(times))
	}
}

// The notes: what happened, the suppressed count, cut to the API's 1 KiB.
func TestNotes(t *testing.T) {
	fr := k8sevents.NewFakeRecorder(100)
	now := time.Unix(1000, 0)
	r := newRecorder(nil, fr, "node-a", quietLog(), func() time.Time { return now })
	for range 5 {
		r.ConfigRejected(errors.New("fixes.invalid-drop.enabled: not a boolean"))
	}
	now = now.Add(Window)
	r.FixSyncFailed("invalid-drop", errors.New(strings.Repeat("é", 1000)))
	r.ConfigRejected(errors.New("again"))
	r.PredecessorTakenOver(3, []rules.Family{rules.IPv4})
	close(fr.Events)
	var got []string
	for e := range fr.Events {
		got = append(got, e)
	}
	want := []string{
		"Warning ConfigReloadRejected keeping the running configuration: fixes.invalid-drop.enabled: not a boolean",
		"Warning ConfigReloadRejected keeping the running configuration: fixes.invalid-drop.enabled: not a boolean",
		"Warning ConfigReloadRejected keeping the running configuration: fixes.invalid-drop.enabled: not a boolean",
		"", // the long note, checked below
		fmt.Sprintf("Warning ConfigReloadRejected keeping the running configuration: again (2 more suppressed by the limit of %d per %s)", Burst, Window),
		"Normal PredecessorTakenOver removed 3 NMANAGER_ chains of the predecessor ([ipv4]) after the first successful sync",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %q", len(got), len(want), got)
	}
	for i := range want {
		if i == 3 {
			note := strings.TrimPrefix(got[i], "Warning FixSyncFailed ")
			if len(note) > noteLimit || !strings.HasSuffix(note, "é…") {
				t.Errorf("long note: %d bytes, ends %q", len(note), note[len(note)-8:])
			}
			continue
		}
		if got[i] != want[i] {
			t.Errorf("event %d:\n got %q\nwant %q", i, got[i], want[i])
		}
	}
}

// apiCalls counts the fake clientset's writes of Events by verb and reason.
type apiCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *apiCalls) reactor(action k8stesting.Action) (bool, runtime.Object, error) {
	reason := ""
	switch act := action.(type) {
	case k8stesting.CreateAction:
		reason = act.GetObject().(*eventsv1.Event).Reason
	case k8stesting.PatchAction:
		reason = "patch"
	}
	a.mu.Lock()
	a.n[action.GetVerb()+" "+reason]++
	a.mu.Unlock()
	return false, nil, nil
}

func (a *apiCalls) get(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

// Through the sink (what client-go's events/v1 broadcaster does) into a fake clientset: the event is on the Node
// (referenced as the kubelet does), in namespace default, with our reason, the fix as action and
// our controller; a storm of 200 failures costs one create and one patch (series count 2).
func TestRecorderThroughBroadcaster(t *testing.T) {
	cs := fake.NewClientset()
	calls := &apiCalls{n: map[string]int{}}
	cs.PrependReactor("*", "events", calls.reactor)
	r := New(kubetest.From(cs), "node-a", quietLog())
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()
	list := func() []eventsv1.Event {
		l, err := cs.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	r.FixEnabled("invalid-drop")
	r.FixSyncFailed("invalid-drop", errors.New("iptables-restore: exit status 1"))
	agenttest.Until(t, 20*time.Second, func() bool { return len(list()) == 2 })
	for range 200 {
		r.FixSyncFailed("invalid-drop", errors.New("iptables-restore: exit status 1"))
	}
	// Writes go out in order from one goroutine: once an Event posted after the storm is written,
	// everything the storm would write is.
	r.FixEnabled("marker")
	agenttest.Until(t, 20*time.Second, func() bool { return calls.get("create "+FixEnabled) == 2 })
	evs := list()
	if len(evs) != 3 {
		t.Fatalf("want 2 Events and the marker, got %d", len(evs))
	}
	byReason := map[string]eventsv1.Event{}
	for _, e := range evs {
		if e.Action != "marker" {
			byReason[e.Reason] = e
		}
	}
	en, failed := byReason[FixEnabled], byReason[FixSyncFailed]
	if en.Regarding.Kind != "Node" || en.Regarding.Name != "node-a" || en.Regarding.UID != "node-a" ||
		en.Namespace != "default" || en.Action != "invalid-drop" || en.Type != "Normal" ||
		en.ReportingController != Controller || en.Series != nil {
		t.Errorf("FixEnabled event: %+v", en)
	}
	if failed.Type != "Warning" || failed.Note != "iptables-restore: exit status 1" || failed.Series == nil || failed.Series.Count != 2 {
		t.Errorf("FixSyncFailed event: type %s note %q series %+v", failed.Type, failed.Note, failed.Series)
	}
	if c, p := calls.get("create "+FixSyncFailed), calls.get("patch patch"); c != 1 || p != 1 {
		t.Errorf("a storm of 201 failures wrote %d creates and %d patches, want 1 and 1", c, p)
	}
}

// README.md's table of Events lists every reason, in order, and no other.
func TestReadmeListsReasons(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Events on the Node\n")
	if !ok {
		t.Fatal("README.md has no section \"Events on the Node\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var got []string
	for _, line := range strings.Split(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			got = append(got, strings.Trim(strings.TrimSpace(cells[1]), "`"))
		}
	}
	if !slices.Equal(got, Reasons) {
		t.Errorf("README's Events table lists %q, want %q", got, Reasons)
	}
}

// TestNodeReferenceForKubectlEvents: `kubectl events --for node/NAME` lists the Events whose
// involvedObject has kind Node, apiVersion v1 and the name (kubectl's field selector); without the
// apiVersion the agent's Events were missing from it on a real cluster (make test-cluster).
func TestNodeReferenceForKubectlEvents(t *testing.T) {
	r := newRecorder(nil, nil, "node-a", quietLog(), time.Now)
	if got := r.node; got.APIVersion != "v1" || got.Kind != "Node" || got.Name != "node-a" {
		t.Errorf("the Node reference is %+v, want apiVersion v1, kind Node, name node-a", got)
	}
}
