package agent

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

// FollowPoll is how often the agent asks kube-proxy's /proxyMode while it runs: an answer that
// differs from the last one (another mode, or kube-proxy gone or back) starts a re-detection at
// once; every syncPeriod one runs regardless.
var FollowPoll = time.Second

// FollowSettle is how long a mode read from kube-proxy's traces (a link, a table, a chain, or none
// of them: no kube-proxy) must be seen without a break before the agent follows it. A kube-proxy
// Pod replaced by its DaemonSet is gone for a few seconds, leaving no traces or its old ones (one
// started in nftables mode removes the iptables rules before it answers: 2.9 s from the old one's
// stop to the new one's /proxyMode answer in a CI run of TestAgentFollowsKubeProxy); its answer,
// when it comes, is followed at once.
var FollowSettle = 30 * time.Second

// BackendFactory builds, for a switch while the agent runs, the backend named name (iptables
// variant for the iptables backend) and the Leftovers of the other one, what the switch leaves
// behind (backends.Takeover provides it). It does no I/O.
type BackendFactory func(name, variant string) (backend.Backend, Leftovers, error)

// FollowParams are what following kube-proxy needs. Factory is optional: without it the backend
// stays what it was at start.
type FollowParams struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    *config.Config
	Result    detect.Result
	Probes    *detect.Probes `optional:"true"`
	Engine    *engine.Engine
	Backend   backend.Backend
	Takeover  *Takeover
	Factory   BackendFactory `optional:"true"`
	Events    EventsIn
	Metrics   *metrics.Sync
	Inputs    Inputs
	Log       *slog.Logger
}

// Follow makes the agent follow kube-proxy while it runs (with `proxyMode: auto`; a configured mode
// does not change): kube-proxy's mode is detected again (detect.ProxyMode) every syncPeriod and as
// soon as its /proxyMode answer changes (asked every FollowPoll). A new mode is taken at once when
// kube-proxy answers it, else once every detection for FollowSettle agreed (kube-proxy restarting
// leaves its old traces, or none, for a moment); an unknown result changes nothing. A new mode is
// logged, posted as a ProxyModeChanged Event, exported in nnm_agent_info, and handed to the engine (engine.Follow),
// which asks the fixes again (ipvs-externalip-dnat is refused outside IPVS mode and its rules go in
// the same pass); with `backend: auto` and a backend that is an *engine.Live, a mode that moves the
// backend switches it, and what the old backend holds goes fix by fix once the fix synced with the
// new one (Takeover.Switched), so no fix is without rules in between.
func Follow(p FollowParams) {
	if p.Config.ProxyMode != "auto" {
		p.Log.Debug("not following kube-proxy: proxyMode is configured", "proxyMode", p.Config.ProxyMode)
		return
	}
	probes := detect.RealProbes(nil)
	if p.Probes != nil {
		probes = *p.Probes
	}
	live, _ := p.Backend.(*engine.Live)
	f := &follower{p: p, probes: probes, live: live, mode: p.Result.ProxyMode, source: p.Result.ProxyModeSource,
		backend: p.Result.Backend, period: p.Config.SyncPeriod}
	p.Lifecycle.Append(fx.Hook{OnStart: f.start, OnStop: f.stop})
}

type follower struct {
	p      FollowParams
	probes detect.Probes
	live   *engine.Live
	period time.Duration

	mode, source, backend string  // what the agent runs with now
	pending               Pending // a new mode seen, not from kube-proxy's answer

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (f *follower) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		poll := time.NewTicker(FollowPoll)
		defer poll.Stop()
		resync := time.NewTicker(f.period)
		defer resync.Stop()
		last := f.answer(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
				if a := f.answer(ctx); a != last || f.pending.Mode != "" {
					last = a
					f.check(ctx)
				}
			case <-resync.C:
				f.check(ctx)
			}
		}
	}()
	return nil
}

func (f *follower) stop(context.Context) error {
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
	return nil
}

// answer is kube-proxy's /proxyMode answer, or "" when it gives none.
func (f *follower) answer(ctx context.Context) string {
	if f.probes.ProxyModeEndpoint == nil {
		return ""
	}
	body, err := f.probes.ProxyModeEndpoint(ctx)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(body)
}

// check detects the mode again and follows it when Decide says so.
func (f *follower) check(ctx context.Context) {
	r := detect.ProxyMode(ctx, f.probes)
	if ctx.Err() != nil {
		return
	}
	was := f.pending
	take, pending := Decide(f.mode, f.pending, r, time.Now())
	f.pending = pending
	switch {
	case r.Mode == "":
		f.p.Log.Debug("kube-proxy mode not detected on resync; keeping the running one", "proxyMode", f.mode, "why", r.Unknown)
	case pending.Mode != "" && pending.Mode != was.Mode:
		f.p.Log.Info("kube-proxy mode may have changed; following it if it holds", "proxyMode", f.mode, "seen", pending.Mode,
			"source", r.Source, "settle", FollowSettle)
	case pending.Mode == "" && was.Mode != "" && !take:
		f.p.Log.Info("kube-proxy mode change did not hold; keeping the running one", "proxyMode", f.mode, "seen", was.Mode)
	}
	if take {
		f.follow(r)
	}
}

// Pending is a new mode the follower has seen from kube-proxy's traces, and since when.
type Pending struct {
	Mode  string
	Since time.Time
}

// Decide is the follower's rule: given the mode the agent runs with, what is pending and a
// detection made at now, whether to take the detected mode now, and what is pending after. A mode
// from kube-proxy's own answer is taken at once; one from other traces (a link, a table, a chain, no
// kube-proxy at all) once it has been seen for FollowSettle without another mode in between, since
// kube-proxy restarting in another mode leaves its old traces, or none, for a moment; an unknown
// result keeps everything.
func Decide(running string, pending Pending, r detect.ProxyModeResult, now time.Time) (take bool, next Pending) {
	switch {
	case r.Mode == "":
		return false, pending
	case r.Mode == running:
		return false, Pending{}
	case r.Source == detect.SourceMetricsEndpoint:
		return true, Pending{}
	case r.Mode != pending.Mode:
		return false, Pending{Mode: r.Mode, Since: now}
	case now.Sub(pending.Since) >= FollowSettle:
		return true, Pending{}
	}
	return false, pending
}

// follow switches to r's mode: the backend with it under `backend: auto`, the engine, the metric,
// the log and the Event.
func (f *follower) follow(r detect.ProxyModeResult) {
	from, fromBackend := f.mode, f.backend
	var next backend.Backend
	if f.p.Config.Backend == "auto" {
		name, _ := detect.BackendFor(r.Mode)
		switch {
		case name == f.backend:
		case f.live == nil || f.p.Factory == nil:
			f.p.Log.Warn("kube-proxy's new mode calls for another backend, but this agent cannot switch while running; restart it", "backend", f.backend, "wanted", name)
		default:
			be, leftovers, err := f.p.Factory(name, f.p.Result.IptablesVariant)
			if err != nil {
				f.p.Log.Error("cannot build the backend kube-proxy's new mode calls for; keeping the running one", "backend", name, "err", err)
				break
			}
			// Before the engine switches: from now on, what the old backend holds goes fix by fix.
			f.p.Takeover.Switched(leftovers, be.Name())
			next = be
		}
	}
	env := f.p.Engine.Env()
	env.ProxyMode = r.Mode
	if err := f.p.Engine.Follow(env, next); err != nil {
		f.p.Log.Error("cannot follow kube-proxy's mode", "err", err)
		return
	}
	m := f.p.Metrics.Info
	m.DeleteLabelValues(f.p.Inputs.Version, f.backend, f.p.Result.IptablesVariant, f.mode, f.source)
	f.mode, f.source = r.Mode, r.Source
	if next != nil {
		f.backend = next.Name()
	}
	m.WithLabelValues(f.p.Inputs.Version, f.backend, f.p.Result.IptablesVariant, f.mode, f.source).Set(1)
	f.p.Log.Info("kube-proxy mode changed; following it", "from", from, "to", r.Mode, "source", r.Source,
		"backendFrom", fromBackend, "backend", f.backend, "evidence", strings.Join(r.Evidence, "; "))
	f.p.Events.Recorder.ProxyModeChanged(from, r.Mode, r.Source, fromBackend, f.backend)
}
