// Package diagnose answers "which of the problems the fixes repair does this node have?": a set of
// read-only checks (Check), each reading the kernel (counters, sysctls, links, routes, conntrack,
// kube-proxy's rules) and, where it needs them, the cluster's objects, and saying per problem: ok,
// problem, handled by <fix>, or cannot tell and why; with the evidence it read and the fix or
// setting that would handle it. `network-node-manager diagnose` prints one Report (Text, JSON); the
// running agent exports the same findings as metrics (Metrics).
//
// Nothing here writes: no rule, table, sysctl, link or conntrack entry is created or changed
// (internal/app's TestDiagnoseChangesNothing).
package diagnose

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
)

// SchemaVersion is the version of the JSON document (Report). It changes when a field is renamed,
// removed or changes meaning; fields and checks are added without a change.
const SchemaVersion = 1

// State is a check's verdict.
type State string

// The states. Problem is a problem that no enabled fix handles.
const (
	OK         State = "ok"
	Problem    State = "problem"
	Handled    State = "handled"
	CannotTell State = "cannot-tell"
)

// States are all states, in the order the metric lists them.
var States = []State{OK, Problem, Handled, CannotTell}

// ExitProblem is the exit status of `diagnose` when some check found a problem that no enabled fix
// handles (1 is an error of the command itself, 0 no such problem).
const ExitProblem = 2

// Evidence is one thing a check read: a counter, a sysctl, an object, addresses.
type Evidence struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Finding is what one check found.
type Finding struct {
	// Check is the check's id (kebab-case, the metric's check label); Title says what it looks for.
	Check string `json:"check"`
	Title string `json:"title"`
	State State  `json:"state"`
	// HandledBy is the fix that handles the problem here (State Handled).
	HandledBy string `json:"handledBy,omitempty"`
	// Summary is one sentence: what was found, or why the check cannot tell.
	Summary  string     `json:"summary"`
	Evidence []Evidence `json:"evidence,omitempty"`
	// Remedy is the fix or setting that would handle the problem ("" when nothing is needed).
	Remedy string `json:"remedy,omitempty"`
	// ReportOnly: no fix of the agent handles this problem; it is reported for the operator.
	ReportOnly bool `json:"reportOnly,omitempty"`

	// counters are the raw counters the check read, for the next run's rise (Env.Previous).
	counters map[string]uint64
}

// Report is one run of every check: the JSON document of `diagnose --output json`.
type Report struct {
	SchemaVersion int    `json:"schemaVersion"`
	Node          string `json:"node,omitempty"`
	// ProxyMode is kube-proxy's mode as detected ("" unknown), ProxyModeSource how.
	ProxyMode       string `json:"proxyMode"`
	ProxyModeSource string `json:"proxyModeSource,omitempty"`
	// Override is the nodeOverrides entry in effect on this node ("override 0 (pool=canary)",
	// "no override"; omitted when not known).
	Override string `json:"override,omitempty"`
	// Fixes lists every registered fix and whether it runs on this node.
	Fixes []FixState `json:"fixes"`
	// API says whether the cluster's objects could be read ("ok", or why not).
	API      string    `json:"api"`
	Findings []Finding `json:"findings"`
	// Problems counts the findings with State Problem.
	Problems int `json:"problems"`
}

// FixState is one fix in a Report.
type FixState struct {
	ID      string `json:"id"`
	Enabled bool   `json:"enabled"`
	// Refused is why an enabled fix refuses to run here ("" when it runs or is disabled).
	Refused string `json:"refused,omitempty"`
}

// ExitCode is the command's exit status for r: ExitProblem when a check found a problem.
func (r *Report) ExitCode() int {
	if r.Problems > 0 {
		return ExitProblem
	}
	return 0
}

// Check is one diagnosis.
type Check interface {
	// ID is the check's kebab-case id; Title says what it looks for.
	ID() string
	Title() string
	// Run reads what it needs from env and says what it found. It must not write anything. The
	// runner fills Finding.Check and Title.
	Run(ctx context.Context, env *Env) Finding
}

// Env is what the checks read. A nil reader makes the checks that need it say they cannot tell.
type Env struct {
	Node            string
	ProxyMode       string
	ProxyModeSource string
	// Override says which nodeOverrides entry of the configuration applies on this node
	// ("override 0 (pool=canary)", "no override"); "" when not known.
	Override string
	// IptablesVariant is the detected iptables variant ("nft" or "legacy").
	IptablesVariant string
	// Fixes: every registered fix, with its state here.
	Fixes []FixState
	// Options are the effective options of the fixes (fix id → key → value), as configured.
	Options map[string]map[string]any

	Sysctl    nodestate.Sysctl
	Conntrack nodestate.Conntrack
	Stats     nodestate.ConntrackStatsReader
	// Kernel reads links, routes, neighbours and rulesets; the real one reads the namespace of the
	// calling thread.
	Kernel Kernel
	// KubeProxyMetrics returns kube-proxy's /metrics text (127.0.0.1:10249), or an error.
	KubeProxyMetrics func(ctx context.Context) (string, error)

	// PodCIDRs are this node's pod CIDRs (the Node's spec.podCIDRs, else the configured podCIDRs);
	// PodCIDRsWhy says why there are none when empty.
	PodCIDRs    []netip.Prefix
	PodCIDRsWhy string

	// Cluster is what was read from the API: the tables Node, PodCIDRs, Pods, Services and
	// EndpointSlices of the inputs (core/inputs). Missing names the tables that could not be read,
	// with the reason.
	Cluster *fix.Snapshot
	Missing map[string]string
	// APIErr is why the API could not be used at all ("" when it could).
	APIErr string

	// Previous is the last Report of the running agent (nil in the command): checks of counters
	// compare against it.
	Previous *Report
	// Now is when the run starts.
	Now time.Time
}

// Enabled says whether fix id runs here (enabled and not refused).
func (e *Env) Enabled(id string) bool {
	for _, f := range e.Fixes {
		if f.ID == id {
			return f.Enabled && f.Refused == ""
		}
	}
	return false
}

// table returns why the cluster table t cannot be read ("" when it can).
func (e *Env) missing(t fix.TableRef) string {
	if why, ok := e.Missing[t.Name()]; ok {
		return why
	}
	if e.Cluster == nil {
		return "no API access"
	}
	return ""
}

// Run runs every check, in order, and returns the report. A check that panics is reported as
// cannot-tell naming the panic; the others still run.
func Run(ctx context.Context, env *Env, checks []Check) *Report {
	if env.Now.IsZero() {
		env.Now = time.Now()
	}
	r := &Report{SchemaVersion: SchemaVersion, Node: env.Node, ProxyMode: env.ProxyMode,
		ProxyModeSource: env.ProxyModeSource, Override: env.Override, Fixes: slices.Clone(env.Fixes), API: "ok"}
	sort.Slice(r.Fixes, func(i, j int) bool { return r.Fixes[i].ID < r.Fixes[j].ID })
	if env.Cluster == nil {
		r.API = "not read"
		if env.APIErr != "" {
			r.API = env.APIErr
		}
	} else if len(env.Missing) > 0 {
		var parts []string
		for name, why := range env.Missing {
			parts = append(parts, name+": "+why)
		}
		sort.Strings(parts)
		r.API = fmt.Sprintf("partly: %v", parts)
	}
	for _, c := range checks {
		f := runOne(ctx, env, c)
		f.Check, f.Title = c.ID(), c.Title()
		if f.State == "" {
			f.State = CannotTell
		}
		if f.State == Problem {
			r.Problems++
		}
		r.Findings = append(r.Findings, f)
	}
	return r
}

func runOne(ctx context.Context, env *Env, c Check) (f Finding) {
	defer func() {
		if p := recover(); p != nil {
			f = Finding{State: CannotTell, Summary: fmt.Sprintf("the check failed: %v", p)}
		}
	}()
	return c.Run(ctx, env)
}

// Checks are the standard checks, in the order they are reported.
func Checks() []Check {
	return []Check{
		invalidCheck{}, ipvsExternalIPCheck{}, nftNoEndpointCheck{}, pmtuCheck{}, staleUDPCheck{},
		conntrackFillCheck{}, neighbourCheck{}, rpFilterCheck{}, migrationCheck{},
	}
}

// Find returns the finding of check id in r, or nil.
func (r *Report) Find(id string) *Finding {
	for i := range r.Findings {
		if r.Findings[i].Check == id {
			return &r.Findings[i]
		}
	}
	return nil
}

// rise returns how much counter name of check rose since the previous run, and false when there
// is no previous run (the command) or the counter went down (conntrack restarted).
func (e *Env) rise(check, name string, now uint64) (uint64, bool) {
	if e.Previous == nil {
		return 0, false
	}
	f := e.Previous.Find(check)
	if f == nil {
		return 0, false
	}
	prev, ok := f.counters[name]
	if !ok || now < prev {
		return 0, false
	}
	return now - prev, true
}

// cannot is a cannot-tell finding.
func cannot(format string, args ...any) Finding {
	return Finding{State: CannotTell, Summary: fmt.Sprintf(format, args...)}
}

func ev(name string, format string, args ...any) Evidence {
	return Evidence{Name: name, Value: fmt.Sprintf(format, args...)}
}

// addrList formats up to max addresses, and how many more.
func addrList[T fmt.Stringer](list []T, max int) string {
	var s string
	for i, a := range list {
		if i == max {
			return s + fmt.Sprintf(" … (%d more)", len(list)-max)
		}
		if i > 0 {
			s += ", "
		}
		s += a.String()
	}
	return s
}
