package staleudpconntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Limits of the options.
const (
	MaxDeletesLimit    = 100000
	MaxMinDumpInterval = time.Minute
	MinRetention       = time.Second
	MaxRetention       = time.Hour
	MaxPendingGrace    = time.Hour
)

// Fix is the stale-udp-conntrack fix, an Actuator: it changes the conntrack table, not rules.
type Fix struct {
	fix.Base[Config, Config]
	ct  nodestate.Conntrack
	m   *fixMetrics
	now func() time.Time
	// sleep waits for the rate limit; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error

	mu sync.Mutex
	// held: the pod addresses held by this node's live Pods at the last pass (nil before the first).
	// dead: the addresses that a Pod of this node held and no longer holds, with the time the fix
	// saw them go; only entries DNATed to one of them are deleted, for retention. fresh: an address
	// died since the last dump. more: the last pass stopped at maxDeletesPerPass.
	held map[netip.Addr]bool
	// unfinished: the UIDs of this node's Pods that were not finished at the last pass.
	unfinished map[types.UID]bool
	dead       map[netip.Addr]*deadAddr
	fresh      bool
	more       bool
	lastDump   map[rules.Family]time.Time
	// waiting: the Pods of this node waiting for a pod address (namespace/name), with the time the
	// fix first saw them so; holding: the last pass held deletions back for them.
	waiting map[string]*waitingPod
	holding bool
}

// deadAddr is what the fix knows of a dead address.
type deadAddr struct {
	// since: when the fix saw it go.
	since time.Time
	// heldAt: the last pass that held its entries back (zero: none); heldNow: this pass does. Its
	// retention runs from the later of since and heldAt, so that an address is judged at least once
	// after its hold, however long that lasted.
	heldAt  time.Time
	heldNow bool
	// released: its hold ended while Pods still waited (logged once).
	released bool
}

// retained says until when d is remembered.
func (d *deadAddr) retained(retention time.Duration) time.Time {
	if d.heldAt.After(d.since) {
		return d.heldAt.Add(retention)
	}
	return d.since.Add(retention)
}

// waitingPod is a Pod of this node seen without a pod address: since when, and whether the fix
// logged that it waited past pendingGrace.
type waitingPod struct {
	since  time.Time
	warned bool
}

var (
	_ fix.Actuator = (*Fix)(nil)
	_ fix.Checker  = (*Fix)(nil)
)

// New builds the fix with its default configuration and registers its metrics.
func New(p fix.Params) (*Fix, error) {
	f := &Fix{ct: p.Conntrack, m: newMetrics(), now: time.Now, sleep: sleep,
		lastDump: map[rules.Family]time.Time{}, dead: map[netip.Addr]*deadAddr{}, waiting: map[string]*waitingPod{}}
	if err := f.Init(spec, p, f.m.collectors()...); err != nil {
		return nil, err
	}
	return f, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func parse(cfg Config) (Config, error) {
	if cfg.MaxDeletesPerPass < 1 || cfg.MaxDeletesPerPass > MaxDeletesLimit {
		return cfg, fix.Invalid("maxDeletesPerPass", "%d is out of range (1 to %d)", cfg.MaxDeletesPerPass, MaxDeletesLimit)
	}
	if cfg.MinDumpInterval < 0 || cfg.MinDumpInterval > MaxMinDumpInterval {
		return cfg, fix.Invalid("minDumpInterval", "%v is out of range (0 to %v)", cfg.MinDumpInterval, MaxMinDumpInterval)
	}
	if cfg.Retention < MinRetention || cfg.Retention > MaxRetention {
		return cfg, fix.Invalid("retention", "%v is out of range (%v to %v)", cfg.Retention, MinRetention, MaxRetention)
	}
	if cfg.PendingGrace < 0 || cfg.PendingGrace > MaxPendingGrace {
		return cfg, fix.Invalid("pendingGrace", "%v is out of range (0 to %v)", cfg.PendingGrace, MaxPendingGrace)
	}
	return cfg, nil
}

// Check refuses to run without a node name: this node's Pods cannot be watched without it.
func (f *Fix) Check(env fix.Env) error {
	if env.NodeName == "" {
		return errors.New("needs the node name (nodeName / NNM_NODE_NAME) to watch this node's Pods")
	}
	return nil
}

// LiveAddrs returns the pod addresses held by Pods that are not finished (Succeeded or Failed):
// pending, running and terminating Pods keep theirs. Host-network Pods hold node addresses, not pod
// addresses, and are left out.
func LiveAddrs(pods []*corev1.Pod) map[netip.Addr]bool {
	live, _, _ := podAddrs(pods, nil)
	return live
}

// podAddrs returns the pod addresses in the status of this node's Pods (host-network Pods hold node
// addresses and are left out): those of Pods that are not finished (live); those of Pods finished
// (Succeeded or Failed) since the last pass, that is, not finished in wasUnfinished (given up); and
// the UIDs of the Pods not finished, for the next pass.
func podAddrs(pods []*corev1.Pod, wasUnfinished map[types.UID]bool) (live, givenUp map[netip.Addr]bool, unfinished map[types.UID]bool) {
	live, givenUp, unfinished = map[netip.Addr]bool{}, map[netip.Addr]bool{}, map[types.UID]bool{}
	for _, p := range pods {
		if p.Spec.HostNetwork {
			continue
		}
		var to map[netip.Addr]bool
		switch {
		case p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed:
			to, unfinished[p.UID] = live, true
		case wasUnfinished[p.UID]:
			to = givenUp
		default:
			continue // finished before the last pass (or before the agent started): judged then, or never
		}
		ips := p.Status.PodIPs
		if len(ips) == 0 && p.Status.PodIP != "" {
			ips = []corev1.PodIP{{IP: p.Status.PodIP}}
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				to[a.Unmap()] = true
			}
		}
	}
	return live, givenUp, unfinished
}

// waitingForAddress says whether p is a Pod of this node that may be about to take a pod address: not
// host-network, not finished, not terminating, and without one in its status (Pending, before or
// during its sandbox's set-up: the CNI may already have given it an address the status does not
// show yet).
func waitingForAddress(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed &&
		p.DeletionTimestamp == nil && p.Status.PodIP == "" && len(p.Status.PodIPs) == 0
}

// waitingPods updates f.waiting from this node's Pods and returns how many waited for an address
// for less than grace, and the first of them. A Pod that waits longer is logged once and no longer
// counts, so a Pod stuck without an address cannot stop the fix for longer than grace.
func (f *Fix) waitingPods(list []*corev1.Pod, now time.Time, grace time.Duration) (int, string) {
	n, first := 0, ""
	seen := map[string]bool{}
	for _, p := range list {
		if grace == 0 || !waitingForAddress(p) {
			continue
		}
		k := p.Namespace + "/" + p.Name
		seen[k] = true
		w := f.waiting[k]
		if w == nil {
			w = &waitingPod{since: now}
			f.waiting[k] = w
		}
		if now.Sub(w.since) < grace {
			if n++; first == "" {
				first = k
			}
			continue
		}
		if !w.warned {
			w.warned = true
			f.Log.Warn("a Pod of this node has had no pod address for longer than pendingGrace: it no longer holds back the deletion of stale entries", "pod", k, "pendingGrace", grace)
		}
	}
	for k := range f.waiting {
		if !seen[k] {
			delete(f.waiting, k)
		}
	}
	return n, first
}

// Ensure learns from this node's Pods which addresses went away (a Pod of this node held them and
// no Pod holds them now) and deletes the UDP entries DNATed to one of those addresses: when one went
// away since the last pass, on full passes (entries recreated meanwhile), and while a bounded pass
// left entries over (Result.More). An entry whose DNAT target is any other address (a live pod of
// this node, a pod of another node, an address never seen held) is never deleted.
func (f *Fix) Ensure(ctx context.Context, snap *fix.Snapshot, full bool) (fix.Result, error) {
	cfg := f.Config()
	list := inputs.Pods.Get(snap)
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	live, givenUp, unfinished := podAddrs(list, f.unfinished)
	f.unfinished = unfinished
	// Gone: an address a Pod of this node was seen holding, or one that a Pod seen unfinished at the
	// last pass shows in its status now that it finished (even if no pass saw the address: a Pod
	// deleted moments after its address appeared is shown finished before it goes), that no live Pod
	// holds.
	for _, seen := range []map[netip.Addr]bool{f.held, givenUp} {
		for a := range seen {
			if _, known := f.dead[a]; !live[a] && !known {
				f.dead[a], f.fresh = &deadAddr{since: now}, true
			}
		}
	}
	for a, d := range f.dead {
		if live[a] || now.After(d.retained(cfg.Retention)) {
			delete(f.dead, a) // held again (the address was reused here), or forgotten
		}
	}
	f.held = live
	f.m.dead.Set(float64(len(f.dead)))
	res := fix.Result{Report: fix.Report{Covered: len(live)}}
	// Pod IP reuse (issue #41): a Pod of this node waiting for its address may already have been
	// given one of the dead addresses by the CNI, before its status shows it; its flows are then
	// DNATed to that address. While such a Pod waits (within pendingGrace), the entries of the
	// addresses given up less than pendingGrace before are held back: the kubelet shows an address
	// in the status within seconds of the CNI giving it, so an address free for longer that a Pod
	// is about to show is the rarer race, and a stream of waiting Pods (one every few seconds, a slow
	// volume or an IPAM outage) can no longer hold every deletion back for good (issue #63).
	waiting, first := f.waitingPods(list, now, cfg.PendingGrace)
	f.m.waiting.Set(float64(waiting))
	held := f.hold(waiting, now, cfg.PendingGrace, first)
	if held > 0 && len(f.dead) == held {
		return res, nil // nothing to judge; fresh and more stay for the pass after the hold
	}
	if len(f.dead) == 0 || (!full && !f.fresh && !f.more) {
		f.fresh, f.more = false, false
		return res, nil
	}
	var errs []error
	more := false
	for _, fam := range rules.Families {
		if !f.anyDead(fam) {
			continue
		}
		if wait := cfg.MinDumpInterval - f.now().Sub(f.lastDump[fam]); wait > 0 {
			if err := f.sleep(ctx, wait); err != nil {
				return res, err
			}
		}
		f.lastDump[fam] = f.now()
		f.m.dumps.WithLabelValues(string(fam)).Inc()
		// Only the entries to a dead address are kept, at most one batch of maxDeletesPerPass: the
		// dump stops there, and the next pass (Result.More) continues.
		var stale []nodestate.ConntrackEntry
		err := f.ct.EachDNAT(ctx, fam, rules.UDP, func(e nodestate.ConntrackEntry) bool {
			if f.isDead(e) {
				stale = append(stale, e)
			}
			return len(stale) < cfg.MaxDeletesPerPass
		})
		if err != nil {
			f.m.errors.WithLabelValues(string(fam), "dump").Inc()
			errs = append(errs, err)
			continue
		}
		more = more || len(stale) >= cfg.MaxDeletesPerPass
		n, err := f.ct.Delete(ctx, stale)
		f.m.deleted.WithLabelValues(string(fam)).Add(float64(n))
		res.Items += n
		if err != nil {
			f.m.errors.WithLabelValues(string(fam), "delete").Inc()
			errs = append(errs, err)
		}
		if n > 0 {
			f.Log.Info("deleted stale UDP conntrack entries", "family", fam, "entries", n, "example", stale[0].String(), "full", full)
		}
	}
	res.Changed = res.Items > 0
	res.More = more
	err := errors.Join(errs...)
	// On error the next pass dumps again (fresh stays), as it does while entries are left over.
	f.fresh = err != nil
	f.more = more
	if more {
		f.Log.Info("more stale UDP conntrack entries than maxDeletesPerPass; the next pass continues", "maxDeletesPerPass", cfg.MaxDeletesPerPass)
	}
	return res, err
}

// reasonPodWaiting is the reason label of addresses held back for a Pod waiting for its address.
const reasonPodWaiting = "pod-waiting"

// hold marks the dead addresses whose entries this pass leaves (deadAddr.heldNow): while Pods of
// this node wait for their address (waiting, the first of them pod), those given up less than grace
// ago. An address whose hold ends while Pods still wait is logged once and judged from this pass on
// (fresh: the table is read now); so are the start and the end of a hold. It exports how many are
// held, and returns it.
func (f *Fix) hold(waiting int, now time.Time, grace time.Duration, pod string) int {
	n := f.markHeld(waiting > 0, now, grace, pod, waiting)
	f.m.heldBack.WithLabelValues(reasonPodWaiting).Set(float64(n))
	switch {
	case n > 0 && !f.holding:
		f.Log.Info("deletion of stale UDP conntrack entries held back: a Pod of this node has no pod address yet and may be taking one of the addresses given up less than pendingGrace ago",
			"pod", pod, "waitingPods", waiting, "heldBack", f.heldList(), "deadAddresses", len(f.dead), "pendingGrace", grace)
	case n == 0 && f.holding:
		f.fresh = true // entries may have waited: dump now
		f.Log.Info("deletion of stale UDP conntrack entries resumes: no dead address is held back any more", "waitingPods", waiting, "deadAddresses", len(f.dead))
	}
	f.holding = n > 0
	return n
}

// markHeld sets deadAddr.heldNow for hold and returns how many are held.
func (f *Fix) markHeld(wait bool, now time.Time, grace time.Duration, pod string, waiting int) int {
	n := 0
	for a, d := range f.dead {
		was := d.heldNow
		d.heldNow = wait && now.Sub(d.since) < grace
		if d.heldNow {
			d.heldAt = now
			n++
			continue
		}
		if was {
			f.fresh = true
			if wait && !d.released {
				d.released = true
				f.Log.Info("judging a dead address although a Pod of this node still waits for a pod address: it was given up more than pendingGrace ago",
					"address", a, "pod", pod, "waitingPods", waiting, "pendingGrace", grace)
			}
		}
	}
	return n
}

// heldList names the held-back addresses for a log line: sorted, at most 8.
func (f *Fix) heldList() string {
	var out []string
	for a, d := range f.dead {
		if d.heldNow {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	if len(out) > 8 {
		out = append(out[:8], fmt.Sprintf("and %d more", len(out)-8))
	}
	return strings.Join(out, ", ")
}

// DNATTarget returns the address e is destination-NATed to (its reply source, when that differs from
// the original destination), and false when e is not destination-NATed. The fix deletes an entry
// whose target is dead; `diagnose` previews with it which entries point to no Pod of this node.
func DNATTarget(e nodestate.ConntrackEntry) (netip.Addr, bool) {
	target := e.Reply.Src.Addr()
	return target, target != e.Orig.Dst.Addr()
}

// isDead says whether e is DNATed to a dead address that this pass judges (not held back).
func (f *Fix) isDead(e nodestate.ConntrackEntry) bool {
	target, ok := DNATTarget(e)
	if !ok {
		return false
	}
	d := f.dead[target]
	return d != nil && !d.heldNow
}

// anyDead says whether this pass judges a dead address of fam.
func (f *Fix) anyDead(fam rules.Family) bool {
	for a, d := range f.dead {
		if !d.heldNow && fam.Contains(a) {
			return true
		}
	}
	return false
}

// Revert restores nothing (deleted entries are gone, and the fix leaves nothing behind); it forgets
// what the fix learnt, so that a fix enabled again starts from the Pods it sees then.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held, f.unfinished, f.fresh, f.more, f.holding = nil, nil, false, false, false
	clear(f.dead)
	clear(f.waiting)
	f.m.dead.Set(0)
	f.m.heldBack.Reset()
	f.m.waiting.Set(0)
	return nil
}
