package staleudpconntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/conntrack"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Limits of the options.
const (
	MaxDeletesLimit    = 100000
	MaxMinDumpInterval = time.Minute
)

// Params is what the core provides.
type Params struct {
	fx.In
	Conntrack conntrack.Interface
	Registry  prometheus.Registerer
	Logger    *slog.Logger `optional:"true"`
}

// Fix is the stale-udp-conntrack fix, an Actuator: it changes the conntrack table, not rules.
type Fix struct {
	ct   conntrack.Interface
	log  *slog.Logger
	opts *fix.Settings[Config, Config]
	m    *fixMetrics
	now  func() time.Time
	// sleep waits for the rate limit; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error

	mu sync.Mutex
	// live: the pod addresses held by the Pods of the last pass. A pass dumps the table when one of
	// them is gone, on full passes, and while entries are left over (pending).
	live     map[netip.Addr]bool
	pending  bool
	lastDump map[rules.Family]time.Time
}

var (
	_ fix.Actuator = (*Fix)(nil)
	_ fix.Checker  = (*Fix)(nil)
)

// New builds the fix with its default configuration and registers its metrics.
func New(p Params) (*Fix, error) {
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	opts, err := fix.NewSettings(ID, DefaultConfig, parse)
	if err != nil {
		return nil, err
	}
	f := &Fix{ct: p.Conntrack, log: log.With("fix", ID), opts: opts, m: newMetrics(), now: time.Now, sleep: sleep,
		lastDump: map[rules.Family]time.Time{}}
	if p.Registry != nil {
		if err := metrics.Register(p.Registry, f.m.collectors()...); err != nil {
			return nil, fmt.Errorf("%s: %w", ID, err)
		}
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
		return cfg, fmt.Errorf("fixes.%s.maxDeletesPerPass: %d is out of range (1 to %d)", ID, cfg.MaxDeletesPerPass, MaxDeletesLimit)
	}
	if cfg.MinDumpInterval < 0 || cfg.MinDumpInterval > MaxMinDumpInterval {
		return cfg, fmt.Errorf("fixes.%s.minDumpInterval: %v is out of range (0 to %v)", ID, cfg.MinDumpInterval, MaxMinDumpInterval)
	}
	return cfg, nil
}

// ID is "stale-udp-conntrack".
func (f *Fix) ID() string { return ID }

// Description is one line.
func (f *Fix) Description() string { return Description }

// DefaultEnabled is false: deleting conntrack entries is a policy the operator chooses.
func (f *Fix) DefaultEnabled(fix.Env) bool { return false }

// Needs this node's Pods (which addresses are live) and its Node (pod CIDRs).
func (f *Fix) Needs() fix.Needs { return fix.Needs{Pods: true, Node: true} }

// Check refuses to run without a node name: without the Pods watch every pod address would look
// unused, and entries of live pods would be deleted.
func (f *Fix) Check(env fix.Env) error {
	if env.NodeName == "" {
		return errors.New("needs the node name (nodeName / NNM_NODE_NAME) to watch this node's Pods")
	}
	return nil
}

// Configure decodes and validates options; on error the previous configuration stays.
func (f *Fix) Configure(options map[string]any) error { return f.opts.Configure(options) }

// LiveAddrs returns the pod addresses held by Pods that are not finished (Succeeded or Failed):
// pending, running and terminating Pods keep theirs. Host-network Pods hold node addresses, not pod
// addresses, and are left out.
func LiveAddrs(pods []*corev1.Pod) map[netip.Addr]bool {
	live := map[netip.Addr]bool{}
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ips := p.Status.PodIPs
		if len(ips) == 0 && p.Status.PodIP != "" {
			ips = []corev1.PodIP{{IP: p.Status.PodIP}}
		}
		for _, ip := range ips {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				live[a.Unmap()] = true
			}
		}
	}
	return live
}

// Stale selects the entries to delete: UDP, destination-NATed to an address in one of podCIDRs that
// is not live. Never TCP (a TCP peer learns from a RST; deleting its entry breaks nothing but is not
// this fix's business), never a live target.
func Stale(entries []conntrack.Entry, podCIDRs []netip.Prefix, live map[netip.Addr]bool) []conntrack.Entry {
	var out []conntrack.Entry
	for _, e := range entries {
		target := e.Reply.Src.Addr()
		if e.Protocol != rules.UDP || target == e.Orig.Dst.Addr() || live[target] || !inAny(target, podCIDRs) {
			continue
		}
		out = append(out, e)
	}
	return out
}

func inAny(a netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Ensure dumps the DNAT entries of each family with pod CIDRs and deletes the stale UDP ones, when a
// pod address went away since the last pass, on full passes (entries left while the agent was down),
// and while a bounded pass left entries over.
func (f *Fix) Ensure(ctx context.Context, snap *fix.Snapshot, full bool) (fix.Result, error) {
	cfg := f.opts.Get()
	if snap.Node == nil {
		// The Node and Pods watches start together; without the Node the Pods may be unknown too,
		// and every pod address would look unused.
		return fix.Result{Report: fix.Report{Skipped: []fix.Skip{{Object: "node", Reason: "no-node",
			Detail: "this node's Node object is not known yet: no entry is judged"}}}}, nil
	}
	live := LiveAddrs(snap.Pods)
	f.mu.Lock()
	defer f.mu.Unlock()
	gone := f.live == nil
	for a := range f.live {
		if !live[a] {
			gone = true
			break
		}
	}
	res := fix.Result{Report: fix.Report{Covered: len(live)}}
	if !full && !gone && !f.pending {
		f.live = live
		return res, nil
	}
	var errs []error
	pending := false
	for _, fam := range rules.Families {
		cidrs := snap.PodCIDRsOf(fam)
		if len(cidrs) == 0 {
			res.Skipped = append(res.Skipped, fix.Skip{Object: string(fam), Reason: "no-pod-cidr", Detail: fmt.Sprintf("no %s pod CIDR: no entry can be judged", fam)})
			continue
		}
		if wait := cfg.MinDumpInterval - f.now().Sub(f.lastDump[fam]); wait > 0 {
			if err := f.sleep(ctx, wait); err != nil {
				return res, err
			}
		}
		f.lastDump[fam] = f.now()
		f.m.dumps.WithLabelValues(string(fam)).Inc()
		entries, err := f.ct.ListDNAT(ctx, fam)
		if err != nil {
			f.m.errors.WithLabelValues(string(fam), "dump").Inc()
			errs = append(errs, err)
			continue
		}
		stale := Stale(entries, cidrs, live)
		if len(stale) > cfg.MaxDeletesPerPass {
			stale, pending = stale[:cfg.MaxDeletesPerPass], true
		}
		n, err := f.ct.Delete(ctx, stale)
		f.m.deleted.WithLabelValues(string(fam)).Add(float64(n))
		res.Items += n
		if err != nil {
			f.m.errors.WithLabelValues(string(fam), "delete").Inc()
			errs = append(errs, err)
		}
		if n > 0 {
			f.log.Info("deleted stale UDP conntrack entries", "family", fam, "entries", n, "example", stale[0].String(), "full", full)
		}
	}
	res.Changed = res.Items > 0
	err := errors.Join(errs...)
	if err == nil {
		// On error the old set stays, so the next pass dumps again.
		f.live = live
	}
	f.pending = pending
	if pending {
		f.log.Info("more stale UDP conntrack entries than maxDeletesPerPass; the next pass continues", "maxDeletesPerPass", cfg.MaxDeletesPerPass)
	}
	return res, err
}

// Revert does nothing: deleted entries are not restored, and the fix leaves nothing behind.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live, f.pending = nil, false
	return nil
}
