// Package metrics holds the core's Prometheus metrics. The registry is created here and injected
// everywhere (fixes register their own metrics on it); nothing is registered globally.
package metrics

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name of the agent.
const Namespace = "nnm"

// Subsystem is the metric subsystem of a fix: its id with underscores, so that the fix's metrics are
// nnm_<id with underscores>_<name> (CONTRIBUTING.md). Fixes set it, with Namespace, in their
// prometheus Opts instead of writing full names.
func Subsystem(fixID string) string { return strings.ReplaceAll(fixID, "-", "_") }

// Register registers every collector on reg and returns the first error, naming the metric.
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Sync is the per-fix sync metrics of the engine. Labels: fix, backend, and family where it applies.
type Sync struct {
	Duration      *prometheus.HistogramVec
	Syncs         *prometheus.CounterVec
	Errors        *prometheus.CounterVec
	Repairs       *prometheus.CounterVec
	Rules         *prometheus.GaugeVec
	LastSuccess   *prometheus.GaugeVec
	Enabled       *prometheus.GaugeVec
	Refused       *prometheus.GaugeVec
	Covered       *prometheus.GaugeVec
	Skipped       *prometheus.GaugeVec
	Info          *prometheus.GaugeVec
	ConfigReloads *prometheus.CounterVec
	// NodeOverride is 1 for the entry of the config file's nodeOverrides that applies on this node.
	NodeOverride *prometheus.GaugeVec
	// Blocked is 1 for a fix and family whose objects cannot be applied because an object of the
	// same name is someone else's (backend.ForeignError), naming it.
	Blocked *prometheus.GaugeVec
}

// NewSync creates and registers the engine's metrics on reg.
func NewSync(reg prometheus.Registerer) *Sync {
	m := &Sync{
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "sync_duration_seconds",
			Help:    "Time to compute and apply one fix's rules for one family.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, []string{"fix", "backend"}),
		Syncs: CounterVec("syncs_total",
			"Sync attempts of a fix (one per family and pass).",
			"fix", "backend"),
		Errors: CounterVec("sync_errors_total",
			"Failed sync attempts of a fix; the previous rules stay in place.",
			"fix", "backend"),
		Repairs: CounterVec("sync_repairs_total",
			"Resyncs that found a fix's rules changed behind the agent's back and restored them.",
			"fix", "backend", "family"),
		Rules: GaugeVec("rules_programmed",
			"Rules (and map entries) the fix has in the kernel.",
			"fix", "backend", "family"),
		LastSuccess: GaugeVec("last_successful_sync_timestamp_seconds",
			"Unix time of the fix's last successful sync.",
			"fix", "backend"),
		Enabled: GaugeVec("fix_enabled",
			"1 if the fix runs, 0 if it is disabled or refused.",
			"fix"),
		Refused: GaugeVec("fix_refused",
			"1 if the config enabled the fix but it refused to run in this environment (e.g. the DNAT fix outside IPVS mode).",
			"fix"),
		Covered: GaugeVec("fix_objects_covered",
			"Objects (e.g. Services) the fix programmed rules for.",
			"fix", "family"),
		Skipped: GaugeVec("fix_objects_skipped",
			"Objects the fix left out, by reason.",
			"fix", "family", "reason"),
		Info: GaugeVec("agent_info",
			"Always 1; labels say what the agent runs with and how it was found.",
			"version", "backend", "iptables_variant", "proxy_mode", "proxy_mode_source"),
		ConfigReloads: CounterVec("config_reloads_total",
			"Config file reloads by result (success or error).",
			"result"),
		NodeOverride: GaugeVec("config_node_override",
			"1 for the entry of the config file's nodeOverrides that applies on this node (override is its index from 0, or none).",
			"override"),
		Blocked: GaugeVec("fix_blocked",
			"1 while the fix cannot apply its rules in family because object, named like one it makes, is not the agent's (left untouched).",
			"fix", "family", "object"),
	}
	reg.MustRegister(m.Duration, m.Syncs, m.Errors, m.Repairs, m.Rules, m.LastSuccess, m.Enabled,
		m.Refused, m.Covered, m.Skipped, m.Info, m.ConfigReloads, m.NodeOverride, m.Blocked)
	return m
}

// CounterVec is a counter vector named nnm_<name>, labelled by labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

// GaugeVec is a gauge vector named nnm_<name>, labelled by labels.
func GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

// NewReady registers nnm_agent_ready, the /readyz check as a gauge (evaluated at scrape time), so that
// alerts see a node whose agent runs but is not ready without kube-state-metrics.
func NewReady(reg prometheus.Registerer, ready func() error) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "agent_ready",
		Help: "1 when /readyz succeeds (the watches synced and one pass applied every enabled fix), else 0.",
	}, func() float64 {
		if ready() != nil {
			return 0
		}
		return 1
	}))
}
