package staleudpconntrack

// Test address plan: this node's pod CIDRs are 10.244.1.0/24 and fd00:10:244:1::/64; pods A
// (10.244.1.10, fd00:10:244:1::a) and B (10.244.1.11, fd00:10:244:1::b); clients 192.0.2.7 and
// 2001:db8::7 send to the node's hostPort 8125 on 198.51.100.1 / 2001:db8:1::1. 10.96.0.10 is a
// Cluster-IP target outside the pod CIDRs; 10.244.2.20 is a pod of another node (inside the
// cluster's 10.244.0.0/16, the documented podCIDRs fallback).

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

func pod(name string, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Status: corev1.PodStatus{Phase: phase}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func entry(proto rules.Protocol, client, nodePort, target string) nodestate.ConntrackEntry {
	c, n, tg := netip.MustParseAddrPort(client), netip.MustParseAddrPort(nodePort), netip.MustParseAddrPort(target)
	fam := rules.IPv4
	if c.Addr().Is6() {
		fam = rules.IPv6
	}
	return nodestate.ConntrackEntry{Family: fam, Protocol: proto, Orig: nodestate.ConntrackTuple{Src: c, Dst: n}, Reply: nodestate.ConntrackTuple{Src: tg, Dst: c}}
}

var (
	podA     = pod("a", corev1.PodRunning, "10.244.1.10", "fd00:10:244:1::a")
	podB     = pod("b", corev1.PodRunning, "10.244.1.11", "fd00:10:244:1::b")
	toA4     = entry(rules.UDP, "192.0.2.7:40000", "198.51.100.1:8125", "10.244.1.10:8125")
	toA6     = entry(rules.UDP, "[2001:db8::7]:40000", "[2001:db8:1::1]:8125", "[fd00:10:244:1::a]:8125")
	toB4     = entry(rules.UDP, "192.0.2.7:40001", "198.51.100.1:8125", "10.244.1.11:8125")
	tcpToA4  = entry(rules.TCP, "192.0.2.7:40002", "198.51.100.1:8125", "10.244.1.10:8125")
	toSvc4   = entry(rules.UDP, "192.0.2.7:40003", "198.51.100.1:53", "10.96.0.10:53")
	direct4  = entry(rules.UDP, "192.0.2.7:40004", "10.244.1.10:8125", "10.244.1.10:8125")  // no DNAT
	remote4  = entry(rules.UDP, "10.244.1.10:40005", "10.96.0.20:8125", "10.244.2.20:8125") // local pod → ClusterIP → pod of another node
	dualNode = testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64")))
)

// newEnv builds the fix on a conntrack table holding entries; it never waits for its rate limit.
func newEnv(t *testing.T, options map[string]any, entries ...nodestate.ConntrackEntry) *testkit.FixEnv[*Fix] {
	t.Helper()
	e := testkit.NewFixEnv(t, New, options)
	e.Conntrack.Add(entries...)
	e.Fix.sleep = func(context.Context, time.Duration) error { return nil }
	return e
}

// ensure runs one pass of the fix on a dual-stack node whose live Pods are pods.
func ensure(e *testkit.FixEnv[*Fix], full bool, live ...*corev1.Pod) fix.Result {
	snap := testkit.Snapshot(dualNode)
	inputs.Pods.Set(snap, live)
	return e.Ensure(snap, full)
}

func TestDeletesOnlyStaleUDPToGonePods(t *testing.T) {
	e := newEnv(t, nil, toA4, toA6, toB4, tcpToA4, toSvc4, direct4)
	// First pass, both pods live: nothing is dead, the table is not even read.
	if res := ensure(e, true, podA, podB); res.Items != 0 || len(e.Conntrack.Entries()) != 6 || e.Conntrack.Dumps[rules.IPv4] != 0 {
		t.Fatalf("with both pods live: deleted %d, dumps %v, table %v", res.Items, e.Conntrack.Dumps, e.Conntrack.Entries())
	}
	// Pod A is gone: its UDP entries of both families go; TCP, Service, non-DNAT and B's stay.
	res := ensure(e, false, podB)
	if res.Items != 2 || !res.Changed {
		t.Fatalf("deleted %d entries, want 2 (A's UDP, both families)", res.Items)
	}
	// No skip: pod CIDRs play no part (the old per-family skip was logged as family="" object=ipv6).
	if len(res.Skipped) != 0 {
		t.Errorf("skips %+v, want none", res.Skipped)
	}
	want := []nodestate.ConntrackEntry{toB4, tcpToA4, toSvc4, direct4}
	if got := e.Conntrack.Entries(); len(got) != len(want) {
		t.Fatalf("table after A is gone: %v, want %v", got, want)
	}
	for _, w := range want {
		found := false
		for _, g := range e.Conntrack.Entries() {
			found = found || g == w
		}
		if !found {
			t.Errorf("%s was deleted", w)
		}
	}
	// A pass without a change does not dump again.
	dumps := e.Conntrack.Dumps[rules.IPv4]
	ensure(e, false, podB)
	if e.Conntrack.Dumps[rules.IPv4] != dumps {
		t.Error("a pass without a pod going away dumped the table")
	}
	// An entry to A recreated meanwhile (the DNAT still pointed to A for a moment) is caught by the
	// next full pass, within the retention.
	e.Conntrack.Add(toA4)
	if res := ensure(e, true, podB); res.Items != 1 {
		t.Fatalf("full pass deleted %d, want the recreated entry", res.Items)
	}
}

// Only addresses that a Pod of this node was seen holding and no longer holds are judged: a flow
// to a pod of another node (inside the fallback podCIDRs 10.244.0.0/16, or anywhere with Calico
// IPAM) and an address never seen held (a Pod deleted while the agent was down) are left, on
// every kind of pass (issue 19, item 4).
func TestNeverJudgesAddressesNotSeenGoing(t *testing.T) {
	left := entry(rules.UDP, "192.0.2.7:40006", "198.51.100.1:8125", "10.244.1.12:8125") // its Pod was gone before the fix started
	e := newEnv(t, nil, remote4, left, toA4)
	snap := testkit.Snapshot(testkit.WithNode(testkit.Node("node-a")), testkit.WithPodCIDRs("10.244.0.0/16"))
	for i, live := range [][]*corev1.Pod{{podA}, {}, {}, {podB}} {
		inputs.Pods.Set(snap, live)
		e.Ensure(snap, true)
		if i == 0 && len(e.Conntrack.Entries()) != 3 {
			t.Fatalf("first pass deleted entries: %v", e.Conntrack.Entries())
		}
	}
	if got := e.Conntrack.Entries(); len(got) != 2 || got[0] != remote4 || got[1] != left {
		t.Fatalf("table %v; want only A's entry deleted, the remote pod's and the never-seen address's left", got)
	}
}

// An address given up and taken again by another Pod of this node is live again.
func TestReusedAddressIsLive(t *testing.T) {
	e := newEnv(t, nil)
	ensure(e, true, podA)
	ensure(e, false)
	c := pod("c", corev1.PodRunning, "10.244.1.10")
	e.Conntrack.Add(toA4) // a flow to the new pod C
	ensure(e, true, c)
	if len(e.Conntrack.Entries()) != 1 {
		t.Fatal("the entry to the address's new live Pod was deleted")
	}
}

// An address is forgotten after the retention: entries to it are no longer judged.
func TestRetention(t *testing.T) {
	e := newEnv(t, map[string]any{"retention": "1m"})
	now := time.Unix(1000, 0)
	e.Fix.now = func() time.Time { return now }
	ensure(e, true, podA)
	ensure(e, false)
	now = now.Add(2 * time.Minute)
	e.Conntrack.Add(toA4)
	ensure(e, true)
	if len(e.Conntrack.Entries()) != 1 || e.Conntrack.Dumps[rules.IPv4] != 1 {
		t.Fatalf("after the retention: table %v, dumps %v; want the entry left and no new dump", e.Conntrack.Entries(), e.Conntrack.Dumps)
	}
	if v := testutil.ToFloat64(e.Fix.m.dead); v != 0 {
		t.Errorf("dead_addresses = %v after the retention, want 0", v)
	}
}

func TestFinishedAndTerminatingPods(t *testing.T) {
	done := pod("a", corev1.PodSucceeded, "10.244.1.10")
	terminating := pod("a", corev1.PodRunning, "10.244.1.10")
	terminating.DeletionTimestamp = &metav1.Time{}
	host := pod("h", corev1.PodRunning, "10.244.1.10")
	host.Spec.HostNetwork = true
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		gone bool
	}{{"succeeded", done, true}, {"terminating", terminating, false}, {"host-network", host, true}} {
		e := newEnv(t, nil, toA4)
		ensure(e, true, pod("a", corev1.PodRunning, "10.244.1.10"))
		ensure(e, true, tc.pod)
		if gone := len(e.Conntrack.Entries()) == 0; gone != tc.gone {
			t.Errorf("%s pod: entry deleted = %v, want %v", tc.name, gone, tc.gone)
		}
	}
}

// A Pod deleted moments after its address appeared may be first seen with it by a pass already
// finished (the kubelet sets a terminal phase before the Pod goes): the address is given up all
// the same when the last pass saw that Pod unfinished (here: waiting, no address yet), unless a
// live Pod holds it. A Pod already finished at the last pass, or at the first pass (a Job's Pod
// completed before the agent started, whose address may be anyone's by now), is never judged.
// make test-cluster's stale-udp-with failed the first way once: a replacement Pod deleted right
// after it answered was never seen live, and its entry stayed.
func TestFinishedPodNeverSeenLive(t *testing.T) {
	withUID := func(p *corev1.Pod) *corev1.Pod { p.UID = types.UID("uid-" + p.Name); return p }
	waiting := withUID(pod("a", corev1.PodPending))
	hostNet := withUID(pod("a", corev1.PodFailed, "10.244.1.10"))
	hostNet.Spec.HostNetwork = true
	for _, tc := range []struct {
		name   string
		before []*corev1.Pod // besides podB, at the previous pass
		now    []*corev1.Pod // besides podB
		gone   bool
	}{
		{"failed", []*corev1.Pod{waiting}, []*corev1.Pod{withUID(pod("a", corev1.PodFailed, "10.244.1.10"))}, true},
		{"succeeded", []*corev1.Pod{waiting}, []*corev1.Pod{withUID(pod("a", corev1.PodSucceeded, "10.244.1.10"))}, true},
		{"failed, the address taken again", []*corev1.Pod{waiting}, []*corev1.Pod{withUID(pod("a", corev1.PodFailed, "10.244.1.10")), withUID(pod("c", corev1.PodRunning, "10.244.1.10"))}, false},
		{"failed, host network", []*corev1.Pod{waiting}, []*corev1.Pod{hostNet}, false},
		{"finished already at the last pass", []*corev1.Pod{withUID(pod("a", corev1.PodSucceeded, "10.244.1.10"))}, []*corev1.Pod{withUID(pod("a", corev1.PodSucceeded, "10.244.1.10"))}, false},
		{"another Pod seen unfinished", []*corev1.Pod{withUID(pod("z", corev1.PodPending))}, []*corev1.Pod{withUID(pod("a", corev1.PodFailed, "10.244.1.10"))}, false},
	} {
		e := newEnv(t, nil, toA4, toB4)
		ensure(e, true, append([]*corev1.Pod{podB}, tc.before...)...)
		ensure(e, false, append([]*corev1.Pod{podB}, tc.now...)...)
		if gone := len(e.Conntrack.Entries()) == 1; gone != tc.gone {
			t.Errorf("%s: entry to 10.244.1.10 deleted = %v, want %v (table %v)", tc.name, gone, tc.gone, e.Conntrack.Entries())
		}
		if got := e.Conntrack.Entries(); !slices.Contains(got, toB4) {
			t.Errorf("%s: the live Pod's entry was deleted (table %v)", tc.name, got)
		}
	}
	// The first pass judges no finished Pod: it has no last pass.
	e := newEnv(t, nil, toA4)
	ensure(e, true, withUID(pod("a", corev1.PodFailed, "10.244.1.10")))
	ensure(e, true, withUID(pod("a", corev1.PodFailed, "10.244.1.10")))
	if len(e.Conntrack.Entries()) != 1 {
		t.Error("a Pod finished before the first pass had its address judged")
	}
}

func TestBoundedPasses(t *testing.T) {
	var entries []nodestate.ConntrackEntry
	for i := range 5 {
		entries = append(entries, entry(rules.UDP, "192.0.2.7:"+string(rune('1'+i))+"0000", "198.51.100.1:8125", "10.244.1.10:8125"))
	}
	e := newEnv(t, map[string]any{"maxDeletesPerPass": 2}, entries...)
	ensure(e, true, podA)
	for pass, want := range []struct {
		left int
		more bool
	}{{3, true}, {1, true}, {0, false}, {0, false}} {
		res := ensure(e, false) // A is gone; then the passes continue without a change
		if n := len(e.Conntrack.Entries()); n != want.left || res.More != want.more {
			t.Fatalf("after pass %d: %d entries left, More %v; want %d, %v", pass+1, n, res.More, want.left, want.more)
		}
	}
}

func TestErrorsKeepTrying(t *testing.T) {
	e := newEnv(t, nil, toA4)
	ensure(e, true, podA)
	e.Conntrack.ListErr = errors.New("netlink: operation not permitted")
	if _, err := e.Fix.Ensure(context.Background(), testkit.Snapshot(dualNode), false); err == nil {
		t.Fatal("a failed dump is not an error")
	}
	e.Conntrack.ListErr = nil
	// The failed pass did not forget that A went away: the next, unchanged, pass dumps again.
	ensure(e, false)
	if len(e.Conntrack.Entries()) != 0 {
		t.Fatal("the entry survived the retry")
	}
	for name, want := range map[string]string{
		"nnm_stale_udp_conntrack_deleted_entries_total": `{family="ipv4"} 1` + "\n" + `{family="ipv6"} 0`,
		"nnm_stale_udp_conntrack_errors_total":          `{family="ipv4",operation="dump"} 1` + "\n" + `{family="ipv6",operation="dump"} 1`,
		"nnm_stale_udp_conntrack_dead_addresses":        "2",
	} {
		if got := e.Metric(name); got != want {
			t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
		}
	}
	testkit.Promlint(t, e.Registry)
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, map[string]any{"minDumpInterval": "1s"}, toA4)
	now := time.Unix(1000, 0)
	var slept []time.Duration
	e.Fix.now = func() time.Time { return now }
	e.Fix.sleep = func(_ context.Context, d time.Duration) error { slept = append(slept, d); now = now.Add(d); return nil }
	ensure(e, true, podA)
	ensure(e, true) // A gone: both families dump
	now = now.Add(300 * time.Millisecond)
	ensure(e, true)
	// IPv4 waits out the rest of its second; IPv6's second has passed meanwhile.
	if len(slept) != 1 || slept[0] != 700*time.Millisecond {
		t.Fatalf("slept %v, want 700ms once before the second dumps", slept)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		options map[string]any
		want    string
	}{
		{map[string]any{"maxDeletesPerPass": 0}, "fixes.stale-udp-conntrack.maxDeletesPerPass"},
		{map[string]any{"maxDeletesPerPass": 1000000}, "fixes.stale-udp-conntrack.maxDeletesPerPass"},
		{map[string]any{"minDumpInterval": "2h"}, "fixes.stale-udp-conntrack.minDumpInterval"},
		{map[string]any{"minDumpInterval": "soon"}, "minDumpInterval"},
		{map[string]any{"protocols": "udp"}, "protocols"},
		{map[string]any{"retention": "0s"}, "fixes.stale-udp-conntrack.retention"},
		{map[string]any{"retention": "2h"}, "fixes.stale-udp-conntrack.retention"},
		{map[string]any{"pendingGrace": "-1s"}, "fixes.stale-udp-conntrack.pendingGrace"},
		{map[string]any{"pendingGrace": "2h"}, "fixes.stale-udp-conntrack.pendingGrace"},
	} {
		e := newEnv(t, map[string]any{"maxDeletesPerPass": 7})
		e.ConfigureFails(nil, tc.options, tc.want)
		if e.Fix.Config().MaxDeletesPerPass != 7 {
			t.Errorf("a rejected Configure(%v) changed the settings", tc.options)
		}
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, nil)
	if e.Fix.DefaultEnabled(fix.Env{ProxyMode: "iptables"}) {
		t.Error("on by default")
	}
	if got := testkit.Reads(e.Fix); got != "Pods" {
		t.Errorf("Reads = %s", got)
	}
	if e.Fix.Check(fix.Env{}) == nil || e.Fix.Check(fix.Env{NodeName: "n1"}) != nil {
		t.Error("Check must refuse exactly a missing node name")
	}
	if _, a, err := fix.As(e.Fix); a == nil || err != nil {
		t.Errorf("fix.As: actuator %v, error %v; want an Actuator and nothing else (no Rules)", a, err)
	}
}

func TestModule(t *testing.T) {
	var got fix.In
	app := fxtest.New(t, Module, testkit.Fakes(), fx.Populate(&got))
	app.RequireStart().RequireStop()
	if len(got.Fixes) != 1 || got.Fixes[0].ID() != ID {
		t.Fatalf("fixes group = %v", got.Fixes)
	}
	if _, ok := got.Fixes[0].(fix.Actuator); !ok {
		t.Error("not an Actuator")
	}
}

func TestREADME(t *testing.T) {
	r := testkit.ReadREADME(t, "README.md", ID)
	e := newEnv(t, r.Options)
	ensure(e, true, podA)
	r.DocumentsMetrics(t, "nnm_stale_udp_conntrack_deleted_entries_total", "nnm_stale_udp_conntrack_dumps_total",
		"nnm_stale_udp_conntrack_errors_total", "nnm_stale_udp_conntrack_dead_addresses")
}

// Pod IP reuse (issue #41, row 11): while a Pod of this node waits for its pod address (Pending, none
// in its status), it may already hold a dead address, so nothing is deleted, also on full passes; the
// held-back addresses are counted. Once it shows its address, that address is live and the other
// dead addresses' entries go at once.
func TestWaitingPodHoldsBack(t *testing.T) {
	e := newEnv(t, nil, toA4, toB4)
	ensure(e, true, podA, podB)
	waiting := pod("c", corev1.PodPending)
	ensure(e, false, waiting) // A and B go; C is scheduled here and waits for an address
	for range 3 {
		if res := ensure(e, true, waiting); res.Items != 0 {
			t.Fatalf("deleted %d entries while a Pod of this node waited for its address", res.Items)
		}
	}
	if len(e.Conntrack.Entries()) != 2 || e.Conntrack.Dumps[rules.IPv4] != 0 {
		t.Fatalf("table %v, dumps %v: want both entries and no dump while C waits", e.Conntrack.Entries(), e.Conntrack.Dumps)
	}
	if held, w := testutil.ToFloat64(e.Fix.m.heldBack), testutil.ToFloat64(e.Fix.m.waiting); held != 4 || w != 1 {
		t.Errorf("held_back_addresses %v, waiting_pods %v; want 4 (A's and B's, both families) and 1", held, w)
	}
	if !strings.Contains(e.Logs.String(), "held back") || !strings.Contains(e.Logs.String(), "default/c") {
		t.Errorf("no log of the hold naming the Pod: %s", e.Logs)
	}
	// C shows A's address: it is live; B's entry goes in this (non-full) pass.
	c := pod("c", corev1.PodRunning, "10.244.1.10")
	if res := ensure(e, false, c); res.Items != 1 {
		t.Fatalf("deleted %d entries when C showed its address, want B's", res.Items)
	}
	if got := e.Conntrack.Entries(); len(got) != 1 || got[0] != toA4 {
		t.Fatalf("table %v, want only the entry to C's (reused) address", got)
	}
	if held := testutil.ToFloat64(e.Fix.m.heldBack); held != 0 {
		t.Errorf("held_back_addresses %v after the wait, want 0", held)
	}
}

// A Pod that waits for its address longer than pendingGrace holds nothing back any more (a Pod
// stuck in ContainerCreating cannot stop the fix), and is logged once; terminating, finished and
// host-network Pods without an address never hold back; pendingGrace 0 turns the hold off.
func TestWaitingPodBounded(t *testing.T) {
	e := newEnv(t, map[string]any{"pendingGrace": "1m"}, toA4)
	now := time.Unix(1000, 0)
	e.Fix.now = func() time.Time { return now }
	stuck := pod("stuck", corev1.PodPending)
	ensure(e, true, podA)
	ensure(e, false, stuck)
	now = now.Add(30 * time.Second)
	if res := ensure(e, true, stuck); res.Items != 0 {
		t.Fatalf("deleted %d within the grace", res.Items)
	}
	now = now.Add(31 * time.Second)
	if res := ensure(e, true, stuck); res.Items != 1 {
		t.Fatalf("deleted %d after the grace, want A's entry", res.Items)
	}
	ensure(e, true, stuck)
	if n := strings.Count(e.Logs.String(), "longer than pendingGrace"); n != 1 {
		t.Errorf("the stuck Pod was logged %d times, want once: %s", n, e.Logs)
	}
	if w := testutil.ToFloat64(e.Fix.m.waiting); w != 0 {
		t.Errorf("waiting_pods %v for a Pod past the grace, want 0", w)
	}

	terminating := pod("t", corev1.PodPending)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	host := pod("h", corev1.PodPending)
	host.Spec.HostNetwork = true
	for name, p := range map[string]*corev1.Pod{"terminating": terminating, "host-network": host, "failed": pod("f", corev1.PodFailed)} {
		e := newEnv(t, nil, toA4)
		ensure(e, true, podA)
		if res := ensure(e, false, p); res.Items != 1 {
			t.Errorf("a %s Pod without an address held back the deletion", name)
		}
	}
	off := newEnv(t, map[string]any{"pendingGrace": "0s"}, toA4)
	ensure(off, true, podA)
	if res := ensure(off, false, pod("c", corev1.PodPending)); res.Items != 1 {
		t.Error("pendingGrace 0 held back the deletion")
	}
}

// Waiting Pods one after the other (one every 8 s: slow volumes, an IPAM outage) hold back only the
// addresses given up less than pendingGrace before (issue #63 row 4): A, given up while they wait,
// is judged pendingGrace later although a Pod still waits (logged once), while B, given up later,
// is still held; and A is judged although its retention (shorter than the grace here) ran out while
// it was held: its retention runs from the end of its hold. Before, one waiting Pod at a time held
// every deletion back, and A was forgotten when its retention ran out: its entry stayed for good.
func TestWaitingPodStreamHoldsBackOnlyRecentAddresses(t *testing.T) {
	e := newEnv(t, map[string]any{"pendingGrace": "1m", "retention": "30s"}, toA4, toB4)
	now := time.Unix(1000, 0)
	e.Fix.now = func() time.Time { return now }
	ensure(e, true, podA, podB)
	var waiting []*corev1.Pod
	step := func(full bool, live ...*corev1.Pod) fix.Result {
		now = now.Add(8 * time.Second)
		waiting = append(waiting, pod(fmt.Sprintf("w%d", len(waiting)), corev1.PodPending))
		if len(waiting) > 2 {
			waiting = waiting[1:] // the oldest shows its address elsewhere (not A's nor B's)
		}
		return ensure(e, full, append(live, waiting...)...)
	}
	step(true, podB) // A goes (t0); a Pod waits
	heldBack := func() float64 { return testutil.ToFloat64(e.Fix.m.heldBack.WithLabelValues(reasonPodWaiting)) }
	for range 6 { // 48 s: within the grace of A, past its retention
		if res := step(true, podB); res.Items != 0 {
			t.Fatalf("deleted %d entries %v after A went, while A is held back", res.Items, now)
		}
		if heldBack() != 2 {
			t.Fatalf("held_back_addresses{reason=pod-waiting} = %v, want 2 (A's, both families)", heldBack())
		}
	}
	step(true) // B goes (t0 + 56 s)
	res := step(true)
	if res.Items != 1 || len(e.Conntrack.Entries()) != 1 || e.Conntrack.Entries()[0] != toB4 {
		t.Fatalf("at t0 + 64 s with Pods still waiting: deleted %d, table %v; want A's entry gone and B's (held) kept", res.Items, e.Conntrack.Entries())
	}
	if heldBack() != 2 {
		t.Errorf("held_back_addresses{reason=pod-waiting} = %v, want 2 (B's)", heldBack())
	}
	if n := strings.Count(e.Logs.String(), "judging a dead address although a Pod of this node still waits"); n != 2 {
		t.Errorf("the end of the hold of A's two addresses was logged %d times, want once each:\n%s", n, e.Logs)
	}
	for range 8 {
		step(true)
	}
	if len(e.Conntrack.Entries()) != 0 {
		t.Errorf("table %v: B's entry stayed past its own hold", e.Conntrack.Entries())
	}
}
