// Package core wires the agent: configuration, metrics, the input modules (core/inputs) on a watch
// hub, the sync engine and the HTTP endpoints. Fix modules and a rule backend join the graph from outside (see cmd/ and
// examples/custom-agent): the core only knows the contracts in core/fix and core/backend.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/fx"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/events"
	"github.com/network-node-manager/network-node-manager/internal/inputs/builtin"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/logging"
	"github.com/network-node-manager/network-node-manager/internal/nodelock"
	"github.com/network-node-manager/network-node-manager/internal/server"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Inputs are what the command line hands to the graph.
type Inputs struct {
	// Flags holds the config flags (config.AddFlags); nil for none.
	Flags *pflag.FlagSet
	// Environ is the process environment (os.Environ()).
	Environ []string
	// Version is the agent's version string.
	Version string
}

// Module provides configuration, logging, metrics, sysctl access, detection, the input modules and
// the engine. The graph still needs a backend.Backend, a *watch.Hub (Hub or FileHub) and fix
// modules.
var Module = fx.Module("core",
	builtin.Module,
	fx.Provide(
		LoadConfig,
		NewLogger,
		metrics.NewRegistry,
		func(r *prometheus.Registry) prometheus.Registerer { return r },
		metrics.NewSync,
		func(cfg *config.Config) nodestate.Sysctl { return &nodestate.ProcSysctl{Root: cfg.ProcSysPath} },
		Limits,
		func() nodestate.Conntrack { return nodestate.NewConntrack() },
		Detect,
		Env,
		NewEngine,
		NewAPIClient,
		NewTakeover,
		diagnose.NewMetrics,
	),
	// Registered in every graph (the monitoring test lists them); they stay empty unless `run`
	// runs the checks (RunDiagnosis).
	fx.Invoke(func(*diagnose.Metrics) {}),
)

// Agent adds what `run` needs on top of Module: the engine and HTTP server started by the lifecycle,
// and the Events posted on the Node.
var Agent = fx.Options(
	Module,
	// First: nothing is programmed, taken over or cleaned up while another agent holds the node.
	fx.Invoke(TakeNodeLock),
	fx.Provide(NewServer, RunProbes, NewEvents, NodeConditionsFor, NewDiagnosisKick),
	// client-go logs through klog; in the agent its lines join the agent's stream and format.
	fx.Invoke(logging.RouteKlog),
	// The backend can change while the agent runs (Follow): the engine and the fixes hold a Live.
	fx.Decorate(func(be backend.Backend) backend.Backend { return engine.NewLive(be) }),
	fx.Invoke(CleanPredecessor),
	fx.Invoke(RunDiagnosis),
	fx.Invoke(PublishStatus),
	fx.Invoke(func(lc fx.Lifecycle, e *engine.Engine, s *server.Server) {
		lc.Append(fx.Hook{OnStart: s.Start, OnStop: s.Stop})
		lc.Append(fx.Hook{OnStart: e.Start, OnStop: e.Stop})
	}),
	fx.Invoke(Follow),
)

// TakeNodeLock takes the node-local lock (internal/nodelock) when the agent starts, before any other
// start hook, and gives it up when it stops: with another agent on the node's network namespace the
// start fails with an error naming that agent, and this one programs nothing.
func TakeNodeLock(lc fx.Lifecycle, log *slog.Logger) {
	var l *nodelock.Lock
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			var err error
			if l, err = nodelock.Acquire(nodelock.Dir); err != nil {
				return err
			}
			log.Info("holding the node lock", "file", l.File())
			return nil
		},
		OnStop: func(context.Context) error { return l.Release() },
	})
}

// LoadConfig loads the configuration against the registered fix ids and their legacy variables.
func LoadConfig(in Inputs, ids fix.IDs) (*config.Config, error) {
	return config.Load(in.Flags, in.Environ, ids.IDs, ids.Legacy...)
}

// NewLogger returns the agent's structured logger in the configured format (logFormat) and the level
// it logs at (logLevel), which a config reload changes (WatchConfig).
func NewLogger(cfg *config.Config) (*slog.Logger, *slog.LevelVar, error) {
	return NewLoggerTo(os.Stderr, cfg)
}

// NewLoggerTo is NewLogger writing to w.
func NewLoggerTo(w io.Writer, cfg *config.Config) (*slog.Logger, *slog.LevelVar, error) {
	lvl, err := logging.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, nil, fmt.Errorf("config: logLevel: %w", err)
	}
	level := new(slog.LevelVar)
	level.Set(lvl)
	log, err := logging.New(w, cfg.LogFormat, level)
	if err != nil {
		return nil, nil, fmt.Errorf("config: logFormat: %w", err)
	}
	for _, w := range cfg.Warnings {
		log.Warn("config: " + w)
	}
	return log, level, nil
}

// Limits are the agent's resource limits from its configuration (memoryLimit), which the fixes'
// budgets are derived from; it logs the entries per fix they give each backend. (It does not ask
// which backend runs: that would make every command that builds the fixes, `cleanup` too, detect
// kube-proxy.)
func Limits(cfg *config.Config, log *slog.Logger) (fix.Limits, error) {
	m, err := cfg.ParsedMemoryLimit()
	if err != nil {
		return fix.Limits{}, err
	}
	limit, source := m, "memoryLimit"
	if m == 0 {
		limit, source = fix.MemoryLimit, "default"
	}
	attrs, none := []any{"bytes", limit, "source", source}, []string{}
	for _, b := range backend.Names {
		n := fix.MaxEntriesPerFixAt(b, limit)
		attrs = append(attrs, "entriesPerFix."+b, n)
		if n == 0 {
			none = append(none, b)
		}
	}
	if len(none) > 0 {
		log.Warn("the memory limit leaves no room for map entries with backend "+strings.Join(none, ", ")+": every Service a DNAT fix would program there is skipped with a budget reason; raise the limit", attrs...)
	} else {
		log.Info("memory limit", attrs...)
	}
	return fix.Limits{Memory: m}, nil
}

// DetectParams are Detect's dependencies. Probes is optional: without it the node's local signals
// are read (no API call); `run` provides probes with an API client (RunProbes).
type DetectParams struct {
	fx.In
	Config  *config.Config
	Metrics *metrics.Sync
	Inputs  Inputs
	Log     *slog.Logger
	Probes  *detect.Probes `optional:"true"`
}

// Detect resolves "auto" settings, logs what was found and how, and exports it as nnm_agent_info.
func Detect(p DetectParams) detect.Result {
	probes := detect.RealProbes(nil)
	if p.Probes != nil {
		probes = *p.Probes
	}
	r := detect.Resolve(context.Background(), p.Config, probes, p.Log)
	p.Metrics.Info.WithLabelValues(p.Inputs.Version, r.Backend, r.IptablesVariant, r.ProxyMode, r.ProxyModeSource).Set(1)
	p.Log.Info("environment", "proxyMode", r.ProxyMode, "proxyModeSource", r.ProxyModeSource,
		"backend", r.Backend, "backendSource", r.BackendSource,
		"iptablesVariant", r.IptablesVariant, "iptablesVariantSource", r.IptablesVariantSource)
	if f := r.Features; f != nil {
		if !f.NFTables {
			p.Log.Warn("nftables is not usable on this node; the nftables backend would fail", "err", f.NFTablesErr)
		}
		if f.IptablesErr != "" {
			p.Log.Warn("the iptables binary does not run; the iptables backend would fail", "variant", r.IptablesVariant, "err", f.IptablesErr)
		} else {
			p.Log.Info("iptables", "variant", r.IptablesVariant, "version", f.IptablesVersion, "randomFully", f.RandomFully)
		}
		if !f.ConntrackMatch {
			p.Log.Warn("the iptables conntrack match is not available; fixes matching conntrack state will fail", "variant", r.IptablesVariant, "err", f.ConntrackMatchErr)
		}
	}
	if r.ProxyMode == detect.ModeNone {
		p.Log.Info("no kube-proxy on this node: no /proxyMode answer, no kube-proxy chains, tables or kube-ipvs0 link; a kube-proxy ConfigMap alone is not taken for one",
			"evidence", strings.Join(r.Notes, "; "))
	}
	if r.ProxyModeSource == detect.SourceUnknown {
		p.Log.Warn("kube-proxy mode not detected; mode-specific fixes keep their conservative defaults (set proxyMode to override)", "tried", strings.Join(r.Notes, "; "))
	}
	return r
}

// RunProbes are the probes of `run`: the local signals plus the kube-proxy ConfigMap through the
// agent's API client (when one can be built; otherwise the local signals only).
func RunProbes(api *APIClient, log *slog.Logger) *detect.Probes {
	client, err := api.Get()
	if err != nil {
		log.Debug("detection without the kube-proxy ConfigMap", "err", err)
		client = nil
	}
	p := detect.RealProbes(client)
	return &p
}

// Env is what fixes learn about the node.
func Env(cfg *config.Config, r detect.Result) fix.Env {
	return fix.Env{ProxyMode: r.ProxyMode, NodeName: cfg.NodeName}
}

// EngineParams are the engine's dependencies.
type EngineParams struct {
	fx.In
	Fixes   []fix.Fix `group:"fixes"`
	Backend backend.Backend
	Hub     *watch.Hub
	Inputs  []inputs.Input `group:"inputs"`
	Config  *config.Config
	Env     fix.Env
	Metrics *metrics.Sync
	Reg     prometheus.Registerer
	Log     *slog.Logger
	Events  EventsIn
}

// EventsIn is the recorder of the Events on the Node where the graph has one (Agent provides it);
// without it (`plan`, embedders that leave it out) nothing is posted: a nil *events.Recorder is a
// no-op.
type EventsIn struct {
	fx.In
	Recorder *events.Recorder `optional:"true"`
}

// NewEngine builds the engine; it validates and configures every fix. Its readiness is exported as
// nnm_agent_ready.
func NewEngine(p EngineParams) (*engine.Engine, error) {
	o := engine.Options{Fixes: p.Fixes, Backend: p.Backend, Hub: p.Hub, Inputs: p.Inputs,
		Config: p.Config, Env: p.Env, Metrics: p.Metrics, Log: p.Log}
	if p.Events.Recorder != nil {
		o.Notify = p.Events.Recorder
	}
	e, err := engine.New(o)
	if err != nil {
		return nil, err
	}
	if err := p.Reg.Register(p.Hub.SilenceCollector()); err != nil {
		return nil, fmt.Errorf("register nnm_watch_silence_seconds: %w", err)
	}
	return e, metrics.NewReady(p.Reg, Ready(e, p.Hub))
}

// Ready is the agent's readiness (/readyz, nnm_agent_ready): every enabled fix synced in every
// family (engine.Engine.Ready), and the watches hear the API server (watch.Hub.Blind: not for
// longer than watch.BlindAfter).
func Ready(e *engine.Engine, hub *watch.Hub) func() error {
	return func() error { return errors.Join(e.Ready(), hub.Blind()) }
}

// NewServer builds the /metrics, /healthz, /readyz server. With metricsSecure, /metrics is HTTPS and
// every scrape is authenticated and authorized by the API server through the agent's client.
func NewServer(cfg *config.Config, reg *prometheus.Registry, e *engine.Engine, hub *watch.Hub, log *slog.Logger, api *APIClient) (*server.Server, error) {
	opts := server.Options{MetricsAddress: cfg.MetricsAddress, HealthzAddress: cfg.HealthzAddress}
	if cfg.MetricsSecure {
		client, err := api.Get()
		if err != nil {
			return nil, fmt.Errorf("metricsSecure: %w", err)
		}
		if opts.TLS, err = server.TLSConfig(cfg.MetricsCertDir, NodeName(cfg)); err != nil {
			return nil, err
		}
		opts.Auth = server.NewDelegated(client, log).Wrap
	}
	return server.New(opts, reg, server.Checks{Healthy: e.Healthy, Ready: Ready(e, hub), Alive: e.Alive}, log), nil
}

// NodeName is this node's name: the configured one, else the host name (as the kubelet defaults it).
func NodeName(cfg *config.Config) string {
	if cfg.NodeName != "" {
		return cfg.NodeName
	}
	host, _ := os.Hostname()
	return host
}

// NewEvents returns the recorder of the Events posted on this node's Node, started and stopped with
// the agent. Without an API client (no kubeconfig, not in a cluster) it is events.Nop: the agent
// runs and posts nothing.
func NewEvents(lc fx.Lifecycle, cfg *config.Config, log *slog.Logger, api *APIClient) *events.Recorder {
	client, err := api.Get()
	if err != nil {
		log.Info("no Events on the Node: no API client", "err", err)
		return events.Nop()
	}
	r := events.New(client, NodeName(cfg), log)
	lc.Append(fx.Hook{OnStart: r.Start, OnStop: r.Stop})
	return r
}

// APIClient is the agent's one Kubernetes API client: the watches, the kube-proxy probe, the Events
// on the Node and the delegated metrics authentication share its connections and its rate limiter
// (RestConfig: QPS 20, burst 40) instead of making a client each. It is made on first use, with
// client-go's loading rules (RestConfig), so an agent that needs no API (no fix reads a watch, no
// kubeconfig) never makes one. Its transport logs the requests that got no answer or were throttled,
// through the watch hub's WrapTransport once Hub has set it (SetWrap).
type APIClient struct {
	cfg  *config.Config
	once sync.Once
	kube kube.Interface
	err  error
	wrap atomic.Pointer[func(http.RoundTripper) http.RoundTripper]
}

// NewAPIClient returns the agent's API client; it does no I/O.
func NewAPIClient(cfg *config.Config) *APIClient { return &APIClient{cfg: cfg} }

// Get returns the client, made on the first call; every call returns the same client or error.
func (c *APIClient) Get() (kube.Interface, error) {
	c.once.Do(func() {
		rc, err := RestConfig(c.cfg)
		if err != nil {
			c.err = err
			return
		}
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if w := c.wrap.Load(); w != nil {
					return (*w)(rt).RoundTrip(req)
				}
				return rt.RoundTrip(req)
			})
		})
		c.kube, c.err = kube.New(rc)
	})
	return c.kube, c.err
}

// SetWrap puts wrap around every request of the client, also one made before.
func (c *APIClient) SetWrap(wrap func(http.RoundTripper) http.RoundTripper) { c.wrap.Store(&wrap) }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// RestConfig is the REST configuration of the agent's API client: client-go's loading rules, as
// kubectl and the kubelet's tools have them: the kubeconfig key (--kubeconfig), else the files in
// KUBECONFIG, else the in-cluster config.
func RestConfig(cfg *config.Config) (*rest.Config, error) {
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig, Precedence: cfg.KubeconfigPaths}
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			err = fmt.Errorf("no kubeconfig and not in a cluster (set kubeconfig / --kubeconfig / NNM_KUBECONFIG or KUBECONFIG): %w", err)
		}
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	rc.UserAgent = "network-node-manager"
	rc.QPS, rc.Burst = 20, 40
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	return rc, nil
}

// Hub is the production watch.Hub, on the agent's API client, whose transport then logs the
// requests that got no answer (watch.Hub.WrapTransport).
func Hub(cfg *config.Config, log *slog.Logger, api *APIClient) *watch.Hub {
	h := watch.NewHub(api.Get, cfg.NodeName, log)
	api.SetWrap(h.WrapTransport)
	return h
}

// FileHub serves the objects of a YAML file to the inputs (for `plan`): Services, and the other
// kinds the inputs watch. Without a configured node name, the file's one Node is this node.
func FileHub(path string) func(cfg *config.Config, log *slog.Logger, in inputs.Group) (*watch.Hub, error) {
	return func(cfg *config.Config, log *slog.Logger, in inputs.Group) (*watch.Hub, error) {
		if strings.TrimSpace(path) == "" {
			return nil, fmt.Errorf("plan: --services FILE is required")
		}
		f, err := watch.LoadFile(path, InputResources(in.Inputs))
		if err != nil {
			return nil, err
		}
		return FileHubOf(f, cfg, log), nil
	}
}

// FileHubOf is a Hub over the objects of f.
func FileHubOf(f *watch.File, cfg *config.Config, log *slog.Logger) *watch.Hub {
	nodeName := cfg.NodeName
	if nodeName == "" {
		nodeName = f.NodeName
	}
	return watch.NewHub(func() (kube.Interface, error) { return f, nil }, nodeName, log)
}

// InputResources lists the resources the inputs watch.
func InputResources(ins []inputs.Input) []inputs.Resource {
	var out []inputs.Resource
	for _, in := range ins {
		if w, ok := in.(inputs.Watcher); ok {
			out = append(out, w.Resources()...)
		}
	}
	return out
}
