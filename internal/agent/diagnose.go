package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
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
	Sysctl    nodestate.Sysctl
	Conntrack nodestate.Conntrack
	// Overrides is the resolver of nodeOverrides where the graph has one (`run`).
	Overrides *NodeOverrides `optional:"true"`
}

// DiagnoseEnv is the checks' environment without the cluster's objects: this node, what detection
// found, the fixes' states (from the engine, configured with cfg, the configuration in effect on
// this node, whose nodeOverrides entry is ov) and the node's readers.
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

func kubeProxyMetrics(url string) func(context.Context) (string, error) {
	return detect.HTTPGet(url, 4<<20)
}

// RunDiagnosis runs the checks in the agent every DiagnosePeriod and exports the findings
// (nnm_diagnosis_*). The cluster's objects are the engine's snapshot: only the tables the enabled
// fixes read; the checks that need others say so.
func RunDiagnosis(lc fx.Lifecycle, p DiagnoseParams, m *diagnose.Metrics, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func() {
		cfg, ov := p.Config, config.None
		if p.Overrides != nil {
			cfg, ov = p.Overrides.Effective()
		}
		env := DiagnoseEnv(p, cfg, ov)
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
	}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.NewTimer(diagnoseDelay)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-t.C:
					}
					run()
					t.Reset(DiagnosePeriod)
				}
			}()
			return nil
		},
		OnStop: func(context.Context) error { cancel(); wg.Wait(); return nil },
	})
}
