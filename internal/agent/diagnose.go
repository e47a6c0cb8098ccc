package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

// DiagnosePeriod is how often the running agent runs the diagnose checks for the nnm_diagnosis_*
// metrics: they dump conntrack and run iptables-save, too much for every scrape.
const DiagnosePeriod = 5 * time.Minute

// diagnoseDelay is how long after its start the agent first runs the checks (its first syncs
// come first).
const diagnoseDelay = 10 * time.Second

// KubeProxyMetricsURL is kube-proxy's /metrics on the node's loopback.
const KubeProxyMetricsURL = "http://127.0.0.1:10249/metrics"

// DiagnoseParams are what the checks read in a graph of the agent.
type DiagnoseParams struct {
	fx.In
	Config    *config.Config
	Detected  detect.Result
	Engine    *engine.Engine
	Backend   backend.Backend
	Sysctl    nodestate.Sysctl
	Conntrack nodestate.Conntrack
	// Overrides is the resolver of nodeOverrides where the graph has one (`run`).
	Overrides *NodeOverrides `optional:"true"`
}

// DiagnoseEnv is the checks' environment without the cluster's objects: this node, what detection
// found, the fixes' states (from the engine, configured with cfg, the configuration in effect on
// this node, whose nodeOverrides entry is ov; without their last sync: the running agent's engine
// adds it, EngineSyncs) and the node's readers.
func DiagnoseEnv(p DiagnoseParams, cfg *config.Config, ov config.Override) *diagnose.Env {
	// The engine holds kube-proxy's mode as the agent follows it (Follow); detection's result is
	// the mode at start.
	mode, source := p.Engine.Env().ProxyMode, p.Detected.ProxyModeSource
	if mode != p.Detected.ProxyMode {
		source = "followed"
	}
	env := &diagnose.Env{Override: ov.String(),
		Node: p.Config.NodeName, ProxyMode: mode, ProxyModeSource: source,
		IptablesVariant: p.Detected.IptablesVariant,
		Options:         map[string]map[string]any{},
		Sysctl:          p.Sysctl, Conntrack: p.Conntrack,
		Kernel:           diagnose.RealKernel{ProcSys: p.Config.ProcSysPath},
		KubeProxyMetrics: kubeProxyMetrics(KubeProxyMetricsURL),
		Acknowledged:     cfg.AcknowledgedChecks,
	}
	if p.Backend != nil {
		env.RuleCounters = diagnose.BackendCounters(p.Backend)
	}
	for _, f := range cfg.Families {
		if fam, err := rules.ParseFamily(f); err == nil {
			env.Families = append(env.Families, fam)
		}
	}
	if s, ok := p.Conntrack.(nodestate.ConntrackStatsReader); ok {
		env.Stats = s
	}
	for _, st := range p.Engine.Statuses() {
		fs := diagnose.FixState{ID: st.Fix, Enabled: st.Enabled}
		if st.Refusal != nil {
			fs.Refused = st.Refusal.Error()
		}
		env.Fixes = append(env.Fixes, fs)
		env.Options[st.Fix] = cfg.FixOptions(st.Fix)
	}
	return env
}

// EngineSyncs adds to fixes the last sync of each enabled fix as the engine's statuses say
// (the running agent: its engine syncs).
func EngineSyncs(fixes []diagnose.FixState, statuses []engine.Status) {
	for i := range fixes {
		for _, st := range statuses {
			if st.Fix == fixes[i].ID && fixes[i].Enabled {
				fixes[i].Sync = SyncOf(st)
			}
		}
	}
}

// SyncOf is the last sync of a fix as its engine status says: ok when no unit's last pass failed
// and every unit has succeeded once.
func SyncOf(st engine.Status) *diagnose.SyncState {
	s := &diagnose.SyncState{OK: st.LastErr == nil && !st.LastOK.IsZero(), LastOK: st.LastOK}
	if st.LastErr != nil {
		s.Error = st.LastErr.Error()
	}
	return s
}

func kubeProxyMetrics(url string) func(context.Context) (string, error) {
	return detect.HTTPGet(url, 4<<20)
}

// DiagnosisKick asks the running agent for a diagnosis run before the next DiagnosePeriod: a fix's
// state changed (PublishStatus sends it). A kick within diagnoseMinGap of the last run waits for the
// rest of it.
type DiagnosisKick chan struct{}

// NewDiagnosisKick returns the kick channel of `run`.
func NewDiagnosisKick() DiagnosisKick { return make(DiagnosisKick, 1) }

// diagnoseMinGap is the shortest time between two runs of the checks (they dump conntrack).
const diagnoseMinGap = 10 * time.Second

// DiagnosisParams are RunDiagnosis's dependencies.
type DiagnosisParams struct {
	fx.In
	Diagnose   DiagnoseParams
	Metrics    *diagnose.Metrics
	Log        *slog.Logger
	Conditions *NodeConditions `optional:"true"`
	Kick       DiagnosisKick   `optional:"true"`
}

// RunDiagnosis runs the checks in the agent every DiagnosePeriod, and after a kick, and exports the
// findings (nnm_diagnosis_*) and, with an API client, as conditions of this node's Node. The
// cluster's objects are the engine's snapshot: only the tables the enabled fixes read; the checks
// that need others say so.
func RunDiagnosis(lc fx.Lifecycle, dp DiagnosisParams) {
	p, m, log := dp.Diagnose, dp.Metrics, dp.Log
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lastAck := ""
	run := func() {
		cfg, ov := p.Config, config.None
		if p.Overrides != nil {
			cfg, ov = p.Overrides.Effective()
		}
		env := DiagnoseEnv(p, cfg, ov)
		EngineSyncs(env.Fixes, p.Engine.Statuses())
		env.Agent = "from this agent's engine"
		if err := diagnose.ValidateAcknowledged(env.Acknowledged); err != nil && err.Error() != lastAck {
			log.Error("diagnosis: acknowledgedChecks names no check; it stays unacknowledged", "err", err)
			lastAck = err.Error()
		}
		env.Cluster = p.Engine.Snapshot()
		env.Missing = diagnose.FromAgent(env.Cluster, p.Engine.Reads())
		cidrs, _ := p.Config.ParsedPodCIDRs()
		env.PodCIDRs, env.PodCIDRsWhy = diagnose.PodCIDRsOf(env.Cluster, env.Missing, cidrs)
		env.Previous = m.Last()
		r := diagnose.Run(ctx, env, diagnose.Checks())
		m.Set(r, float64(time.Now().Unix()))
		if r.Problems > 0 {
			log.Info("diagnosis: problems no enabled fix handles (nnm_diagnosis_state; `network-node-manager diagnose` for details)", "problems", r.Problems)
		}
		if dp.Conditions != nil {
			if err := dp.Conditions.Publish(ctx, r); err != nil && ctx.Err() == nil {
				log.Warn("diagnosis: the Node's conditions were not updated", "err", err)
			}
		}
	}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTimer(diagnoseDelay)
				defer t.Stop()
				var last time.Time
				settle := false // a kicked run is followed by one more after diagnoseMinGap
				for {
					select {
					case <-ctx.Done():
						return
					case <-dp.Kick:
						settle = true
						if wait := diagnoseMinGap - time.Since(last); !last.IsZero() && wait > 0 {
							t.Reset(wait)
							continue
						}
					case <-t.C:
					}
					run()
					last = time.Now()
					next := DiagnosePeriod
					if settle {
						// The kick came with the fix's new state, not always after its work (a
						// disabled fix reverts after its status says so): look again once it
						// settled.
						next, settle = diagnoseMinGap, false
					}
					t.Reset(next)
				}
			}()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); wg.Wait(); return nil },
	})
}

// statusCheck is how often the agent compares its fixes' states with the status it last wrote.
const statusCheck = 5 * time.Second

// PublishStatus keeps the agent's status (diagnose.AgentStatus: its fixes, their options and last
// sync) in its state directory for `diagnose` run beside it: written when a fix's state, error or
// options change, renewed every diagnose.StatusRefresh, removed when the agent stops. A write that
// fails is logged once per error text; the agent runs on.
func PublishStatus(lc fx.Lifecycle, p DiagnoseParams, kick DiagnosisKick, log *slog.Logger) {
	path, err := diagnose.StatusPath(diagnose.DefaultStatusDir)
	if err != nil {
		log.Warn("no agent status for diagnose", "err", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var last []byte
	var written time.Time
	lastErr := ""
	publish := func() {
		s := agentStatus(p)
		key, _ := json.Marshal(struct {
			F []diagnose.FixState
			O map[string]map[string]any
			V string
		}{withoutLastOK(s.Fixes), s.Options, s.Override})
		now := time.Now()
		if !bytes.Equal(key, last) && last != nil {
			select { // a fix's state changed: the diagnosis (and the Node's conditions) follow
			case kick <- struct{}{}:
			default:
			}
		}
		if bytes.Equal(key, last) && now.Sub(written) < diagnose.StatusRefresh {
			return
		}
		s.PID, s.Written, s.ValidUntil = os.Getpid(), now, now.Add(diagnose.StatusValid)
		if err := diagnose.WriteStatus(path, s); err != nil {
			if err.Error() != lastErr {
				log.Warn("cannot write the agent status for diagnose", "err", err)
				lastErr = err.Error()
			}
			return
		}
		last, written, lastErr = key, now, ""
	}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTicker(statusCheck)
				defer t.Stop()
				for {
					publish()
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
				}
			}()
			return nil
		},
		OnStop: func(context.Context) error {
			cancel()
			wg.Wait()
			return diagnose.RemoveStatus(path)
		},
	})
}

// agentStatus is the agent's status now.
func agentStatus(p DiagnoseParams) *diagnose.AgentStatus {
	cfg, ov := p.Config, config.None
	if p.Overrides != nil {
		cfg, ov = p.Overrides.Effective()
	}
	s := &diagnose.AgentStatus{ConfigFile: p.Config.File, Override: ov.String(), Options: map[string]map[string]any{}}
	statuses := p.Engine.Statuses()
	for _, st := range statuses {
		fs := diagnose.FixState{ID: st.Fix, Enabled: st.Enabled}
		if st.Refusal != nil {
			fs.Refused = st.Refusal.Error()
		}
		s.Fixes = append(s.Fixes, fs)
		if st.Enabled {
			s.Options[st.Fix] = cfg.FixOptions(st.Fix)
		}
	}
	EngineSyncs(s.Fixes, statuses)
	return s
}

// withoutLastOK is fixes without the time of their last success, which moves on every sync.
func withoutLastOK(fixes []diagnose.FixState) []diagnose.FixState {
	out := make([]diagnose.FixState, len(fixes))
	for i, f := range fixes {
		out[i] = f
		if f.Sync != nil {
			s := *f.Sync
			s.LastOK = time.Time{}
			out[i].Sync = &s
		}
	}
	return out
}
