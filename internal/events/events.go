// Package events posts Kubernetes Events (events.k8s.io/v1) on this node's Node object, so that
// `kubectl events --for node/NAME` and `kubectl describe node NAME` show what the agent did: a fix
// enabled, disabled or refused, its first successful sync, its sync failures, the predecessor's chains
// taken over, a config reload rejected.
//
// Events go through a sink that does what client-go's events/v1 broadcaster
// (k8s.io/client-go/tools/events) does, without linking it (see sink): it turns isomorphic events
// (same regarding object, reason, action, type, reporting controller and instance) into one Event
// with a series: the first is created, the second patches the series count to 2, and
// later ones are counted in memory and written every 30 minutes (refreshTime) or when the series ends
// (6 minutes without a new occurrence, finishTime). Before the sink, the Recorder bounds each
// subject (reason and fix): at most Burst events in any Window; the rest are counted and the next
// event that passes says how many were suppressed. A failing backend therefore costs at most Burst
// events per reason and fix per minute, and the API server sees at most a create and a patch per
// series.
package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/core/backend"
	fixpkg "github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// The reasons of the Events the agent posts, CamelCase as Kubernetes reasons are.
const (
	// FixEnabled (Normal): a fix runs, at start or after a config reload enabled it.
	FixEnabled = "FixEnabled"
	// FixDisabled (Normal): a config reload disabled a fix that ran; what it left is removed.
	FixDisabled = "FixDisabled"
	// FixSynced (Normal): a fix's first successful sync since it was enabled (every family).
	FixSynced = "FixSynced"
	// FixSyncFailed (Warning): applying a fix's rules or node state failed; the previous state stays.
	FixSyncFailed = "FixSyncFailed"
	// FixBlocked (Warning): a fix cannot apply its rules in a family because an object named like one
	// of its own (a table, a chain) is someone else's; the note names it. It is left untouched;
	// nnm_fix_blocked is 1 until it is gone.
	FixBlocked = "FixBlocked"
	// ObjectSkipped (Warning): a fix left an object out (a Service over a budget, an address it never
	// DNATs, …); the note names the object, the family and the reason.
	ObjectSkipped = "ObjectSkipped"
	// FixRefused (Warning): the config enabled a fix that refuses to run in this environment (the
	// DNAT fix outside IPVS mode); nnm_fix_refused is 1.
	FixRefused = "FixRefused"
	// PredecessorTakenOver (Normal): the predecessor's NMANAGER_ chains were removed after this
	// agent's first successful sync.
	PredecessorTakenOver = "PredecessorTakenOver"
	// ConfigReloadRejected (Warning): the config file changed but does not load or a fix refused its
	// options; the running configuration stays.
	ConfigReloadRejected = "ConfigReloadRejected"
	// ProxyModeChanged (Normal): re-detection found kube-proxy in another mode (or gone, or back)
	// while the agent runs; the note says from what to what, how it was found, and the backend
	// switch when `backend: auto` followed it.
	ProxyModeChanged = "ProxyModeChanged"
)

// Reasons are all of the above, in the order README.md's table lists them.
var Reasons = []string{FixEnabled, FixDisabled, FixRefused, FixSynced, FixSyncFailed, FixBlocked, ObjectSkipped, PredecessorTakenOver, ConfigReloadRejected, ProxyModeChanged}

// Actions of the events that are not about one fix. An event about a fix has the fix id as its
// action: the broadcaster keys its series on the action, so two fixes' events never merge.
const (
	ActionReload   = "ReloadConfig"
	ActionTakeOver = "TakeOver"
	ActionFollow   = "FollowKubeProxy"
)

// The bound: at most Burst events per subject (reason and action) in any Window.
const (
	Burst  = 3
	Window = time.Minute
)

// Controller is the reportingController of our Events.
const Controller = "network-node-manager"

// noteLimit is the API's limit on an Event's note (events.k8s.io/v1 validation).
const noteLimit = 1024

// Recorder posts the agent's Events on its Node. A nil *Recorder, and Nop(), post nothing.
type Recorder struct {
	rec   eventRecorder
	sink  *sink // nil when rec is a test's
	node  *corev1.ObjectReference
	log   *slog.Logger
	now   func() time.Time
	limit limiter
}

// eventRecorder takes the events that passed the limit: the sink, or a test's recorder (client-go's
// events.FakeRecorder has this method).
type eventRecorder interface {
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...interface{})
}

// Nop returns a Recorder that posts nothing (no API client: `plan`, tests without a kubeconfig).
func Nop() *Recorder { return nil }

// New returns a Recorder that posts on the Node named node through client's events.k8s.io/v1 API.
// It starts nothing: Start does.
func New(client kube.Interface, node string, log *slog.Logger) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	s := newSink(client, Controller, log)
	return newRecorder(s, s, node, log, time.Now)
}

func newRecorder(s *sink, rec eventRecorder, node string, log *slog.Logger, now func() time.Time) *Recorder {
	if log == nil {
		log = slog.Default()
	}
	return &Recorder{rec: rec, sink: s, log: log, now: now, limit: limiter{burst: Burst, window: Window},
		// As the kubelet refers to its Node: by name, with the name as UID, so that the reference
		// holds before the Node exists and after it is recreated; apiVersion v1, which `kubectl
		// events --for node/NAME` selects on (involvedObject.kind, .apiVersion, .name).
		node: &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(node)}}
}

// Start sends the recorded events to the API server until Stop.
func (r *Recorder) Start(context.Context) error {
	if r == nil || r.sink == nil {
		return nil
	}
	r.sink.start()
	return nil
}

// Stop stops sending; events not yet written are dropped.
func (r *Recorder) Stop(context.Context) error {
	if r == nil || r.sink == nil {
		return nil
	}
	r.sink.stop()
	return nil
}

// FixEnabled says that fix runs.
func (r *Recorder) FixEnabled(fix string) {
	r.post(corev1.EventTypeNormal, FixEnabled, fix, "fix %s enabled", fix)
}

// FixDisabled says that fix no longer runs.
func (r *Recorder) FixDisabled(fix string) {
	r.post(corev1.EventTypeNormal, FixDisabled, fix, "fix %s disabled; removing what it programmed", fix)
}

// FixRefused says that the config enabled fix but it refuses to run here.
func (r *Recorder) FixRefused(fix string, err error) {
	r.post(corev1.EventTypeWarning, FixRefused, fix, "%v", err)
}

// FixSynced says that every unit of fix synced successfully for the first time since it was enabled.
func (r *Recorder) FixSynced(fix string) {
	r.post(corev1.EventTypeNormal, FixSynced, fix, "fix %s synced", fix)
}

// FixSyncFailed says that a sync of fix failed: FixBlocked when an object of someone else's blocks
// it (backend.ErrForeign).
func (r *Recorder) FixSyncFailed(fix string, err error) {
	reason := FixSyncFailed
	if errors.Is(err, backend.ErrForeign) {
		reason = FixBlocked
	}
	r.post(corev1.EventTypeWarning, reason, fix, "%v", err)
}

// ObjectSkipped says that fix newly left skip.Object out in family. The bound is per fix: a
// thousand Services skipped at once give Burst Events and a count of the others.
func (r *Recorder) ObjectSkipped(fix, family string, skip fixpkg.Skip) {
	where := ""
	if family != "" {
		where = " (" + family + ")"
	}
	r.post(corev1.EventTypeWarning, ObjectSkipped, fix, "%s skipped %s%s: %s: %s", fix, skip.Object, where, skip.Reason, skip.Detail)
}

// ConfigRejected says that a changed configuration was not taken.
func (r *Recorder) ConfigRejected(err error) {
	r.post(corev1.EventTypeWarning, ConfigReloadRejected, ActionReload, "keeping the running configuration: %v", err)
}

// PredecessorTakenOver says that the predecessor's chains were removed in families.
func (r *Recorder) PredecessorTakenOver(chains int, families []rules.Family) {
	r.post(corev1.EventTypeNormal, PredecessorTakenOver, ActionTakeOver,
		"removed %d NMANAGER_ chains of the predecessor (%v) after the first successful sync", chains, families)
}

// ProxyModeChanged says that kube-proxy's mode changed from one value to another (found through
// source), and the backend with it when from and to backends differ.
func (r *Recorder) ProxyModeChanged(from, to, source, backendFrom, backendTo string) {
	switched := ""
	if backendFrom != backendTo {
		switched = fmt.Sprintf("; switching the rule backend from %s to %s (make before break, fix by fix)", backendFrom, backendTo)
	}
	r.post(corev1.EventTypeNormal, ProxyModeChanged, ActionFollow, "kube-proxy mode %s → %s (%s)%s", describeMode(from), describeMode(to), source, switched)
}

// describeMode names a proxy mode in a note: "none" is no kube-proxy, "" unknown.
func describeMode(m string) string {
	switch m {
	case "":
		return "unknown"
	case fixpkg.ProxyModeNone:
		return "none (no kube-proxy on this node)"
	}
	return m
}

func (r *Recorder) post(typ, reason, action, format string, args ...any) {
	if r == nil || r.rec == nil {
		return
	}
	ok, suppressed := r.limit.allow(reason+"/"+action, r.now())
	if !ok {
		r.log.Debug("node event suppressed (rate limit)", "reason", reason, "action", action)
		return
	}
	note := fmt.Sprintf(format, args...)
	if suppressed > 0 {
		note = fmt.Sprintf("%s (%d more suppressed by the limit of %d per %s)", note, suppressed, Burst, Window)
	}
	r.rec.Eventf(r.node, nil, typ, reason, action, "%s", truncate(note, noteLimit))
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}

// limiter lets at most burst events per key through in any window (a sliding window of the times it
// let through) and counts the others until one passes.
type limiter struct {
	burst  int
	window time.Duration

	mu         sync.Mutex
	sent       map[string][]time.Time
	suppressed map[string]int
}

// allow reports whether an event of key may go now and how many were suppressed since the last one.
func (l *limiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent == nil {
		l.sent, l.suppressed = map[string][]time.Time{}, map[string]int{}
	}
	times := l.sent[key]
	for len(times) > 0 && now.Sub(times[0]) >= l.window {
		times = times[1:]
	}
	if len(times) >= l.burst {
		l.sent[key] = times
		l.suppressed[key]++
		return false, 0
	}
	l.sent[key] = append(times, now)
	n := l.suppressed[key]
	delete(l.suppressed, key)
	return true, n
}
