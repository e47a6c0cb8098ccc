// Package diagnose answers "which of the problems the fixes repair does this node have?": a set of
// read-only checks (Check), each reading the kernel (counters, sysctls, links, routes, conntrack,
// kube-proxy's rules) and, where it needs them, the cluster's objects, and saying per problem: ok,
// problem, handled by <fix>, or cannot tell and why; with the evidence it read and the fix or
// setting that would handle it. `network-node-manager diagnose` prints one Report (Text, JSON); the
// running agent exports the same findings as metrics (Metrics).
//
// Nothing here writes: no rule, table, sysctl, link or conntrack entry is created or changed
// (core/app's TestDiagnoseChangesNothing).
package diagnose

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackcapacity"
)

// SchemaVersion is the version of the JSON document (Report). It changes when a field is renamed,
// removed or changes meaning; fields and checks are added without a change.
const SchemaVersion = 1

// State is a check's verdict.
type State string

// The states. Problem is a problem that no enabled fix handles; Acknowledged is such a problem that
// the configuration acknowledges (acknowledgedChecks): reported, but no alert, no exit status 2.
const (
	OK           State = "ok"
	Problem      State = "problem"
	Handled      State = "handled"
	CannotTell   State = "cannot-tell"
	Acknowledged State = "acknowledged"
)

// States are all states, in the order the metric lists them.
var States = []State{OK, Problem, Handled, CannotTell, Acknowledged}

// ExitProblem is the exit status of `diagnose` when some check found a problem that a fix of the
// agent would handle and no enabled fix handles now (1 is an error of the command itself, 0 no such
// problem). Report-only and acknowledged findings do not make it.
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
	// NotInForce says why an enabled fix that would handle the problem does not (refused, its last
	// sync failed, its rules or settings are not in the kernel); empty when none is enabled.
	NotInForce string `json:"notInForce,omitempty"`

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
	// Problems counts the findings with State Problem; Open those of them that are not report-only:
	// the exit status is ExitProblem when Open is above 0.
	Problems int `json:"problems"`
	Open     int `json:"open"`
	// Agent says where the fixes' states come from: the running agent's status (AgentStatus), or
	// the configuration when no running agent's status was found, and why.
	Agent string `json:"agent,omitempty"`
}

// FixState is one fix in a Report.
type FixState struct {
	ID      string `json:"id"`
	Enabled bool   `json:"enabled"`
	// Refused is why an enabled fix refuses to run here ("" when it runs or is disabled).
	Refused string `json:"refused,omitempty"`
	// Sync is the fix's last sync as the running agent's engine reports it; nil when no running
	// agent's status was read (a fix counts as handling a problem only when its last sync succeeded).
	Sync *SyncState `json:"sync,omitempty"`
}

// SyncState is what the engine says of a fix's last sync.
type SyncState struct {
	// OK: the last pass of every unit (family) of the fix succeeded, which reads the kernel back and
	// restores what differs; Error joins the failing units' last errors otherwise.
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// LastOK is when every unit had last synced successfully (zero: not yet).
	LastOK time.Time `json:"lastOK,omitzero"`
}

// ExitCode is the command's exit status for r: ExitProblem when a check found an open problem (one
// that is not report-only).
func (r *Report) ExitCode() int {
	if r.Open > 0 {
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
	// Agent says where Fixes come from (Report.Agent).
	Agent string
	// Acknowledged are the checks whose problem the configuration acknowledges (acknowledgedChecks).
	Acknowledged []string
	// Families are the IP families the agent programs (the fixes' rules are looked for in these).
	Families []rules.Family
	// RuleCounters reads the named counters of a rule fix's rules in the kernel (the backend the
	// agent runs): present counters prove its rules are there. nil: rules cannot be read.
	RuleCounters func(ctx context.Context, fix string, family rules.Family) (map[string]uint64, error)

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

	// Host reads the node's memory and CPUs (nil: conntrackcapacity.HostInfo).
	Host func() (memBytes uint64, cpus int, err error)

	// Previous is the last Report of the running agent (nil in the command): checks of counters
	// compare against it.
	Previous *Report
	// Now is when the run starts.
	Now time.Time
}

// Enabled says whether fix id runs here (enabled and not refused).
func (e *Env) Enabled(id string) bool {
	f := e.fix(id)
	return f != nil && f.Enabled && f.Refused == ""
}

func (e *Env) fix(id string) *FixState {
	for i := range e.Fixes {
		if e.Fixes[i].ID == id {
			return &e.Fixes[i]
		}
	}
	return nil
}

// inForce says whether fix id handles a problem now: it is enabled and not refused, its last sync
// succeeded (the running agent's engine says so) and proof, the check's reading of the fix's rules or
// settings in the kernel, finds them there (nil: the last sync is the only proof, for a fix whose
// work leaves nothing to read). When it does not, why says what is missing (and "" when the fix is
// simply not enabled); ev is what was read.
func (e *Env) inForce(ctx context.Context, id string, proof func(context.Context, *Env) (bool, string)) (ok bool, why string, evs []Evidence) {
	f := e.fix(id)
	switch {
	case f == nil || !f.Enabled:
		return false, "", nil
	case f.Refused != "":
		return false, id + " is enabled but refuses to run here: " + f.Refused, nil
	case f.Sync == nil:
		return false, id + " is enabled but no running agent's status says its last sync succeeded (" + e.Agent + ")", nil
	case !f.Sync.OK:
		msg := f.Sync.Error
		if msg == "" {
			msg = "no successful sync yet"
		}
		return false, id + " is enabled but its last sync failed: " + msg, nil
	}
	evs = append(evs, ev(id+" last sync", "ok at %s", f.Sync.LastOK.UTC().Format(time.RFC3339)))
	if proof != nil {
		found, what := proof(ctx, e)
		evs = append(evs, ev(id+" in the kernel", "%s", what))
		if !found {
			return false, id + " is enabled and its last sync succeeded, but " + what, evs
		}
	}
	return true, "", evs
}

// BackendCounters reads a fix's named rule counters through be (Env.RuleCounters).
func BackendCounters(be backend.Backend) func(context.Context, string, rules.Family) (map[string]uint64, error) {
	return func(ctx context.Context, fix string, family rules.Family) (map[string]uint64, error) {
		cs, err := be.Counters(ctx, fix, family)
		if err != nil {
			return nil, err
		}
		out := make(map[string]uint64, len(cs))
		for n, c := range cs {
			out[n] = c.Packets
		}
		return out, nil
	}
}

// ruleCounters is the proof of a rule fix whose rules carry named counters: every family the agent
// programs holds at least one of them.
func ruleCounters(id string) func(context.Context, *Env) (bool, string) {
	return func(ctx context.Context, e *Env) (bool, string) {
		if e.RuleCounters == nil {
			return false, "its rules cannot be read here"
		}
		var have, miss []string
		for _, fam := range e.Families {
			c, err := e.RuleCounters(ctx, id, fam)
			switch {
			case err != nil:
				miss = append(miss, fmt.Sprintf("%s: %v", fam, err))
			case len(c) == 0:
				miss = append(miss, string(fam)+": none")
			default:
				names := slices.Sorted(maps.Keys(c))
				have = append(have, string(fam)+": "+strings.Join(names, ", "))
			}
		}
		if len(miss) > 0 {
			return false, "its rules are not in the kernel (" + strings.Join(miss, "; ") + ")"
		}
		if len(have) == 0 {
			return false, "no IP family is programmed"
		}
		return true, "its counted rules are in the kernel (" + strings.Join(have, "; ") + ")"
	}
}

func (e *Env) host() (uint64, int, error) {
	if e.Host != nil {
		return e.Host()
	}
	return conntrackcapacity.HostInfo()
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
		ProxyModeSource: env.ProxyModeSource, Override: env.Override, Fixes: slices.Clone(env.Fixes), API: "ok",
		Agent: env.Agent}
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
		if f.State == Problem && slices.Contains(env.Acknowledged, f.Check) {
			f.State = Acknowledged
		}
		if f.State == Problem {
			r.Problems++
			if !f.ReportOnly {
				r.Open++
			}
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
		conntrackFillCheck{}, neighbourCheck{}, nodePortCheck{}, rpFilterCheck{}, migrationCheck{},
	}
}

// CheckIDs are the ids of the standard checks.
func CheckIDs() []string {
	var out []string
	for _, c := range Checks() {
		out = append(out, c.ID())
	}
	return out
}

// ValidateAcknowledged fails naming each id of acknowledgedChecks that is no check, with the
// nearest one.
func ValidateAcknowledged(ids []string) error {
	known := CheckIDs()
	var errs []error
	for _, id := range ids {
		if slices.Contains(known, id) {
			continue
		}
		hint := ""
		if n := fix.Nearest(id, known); n != "" {
			hint = "; did you mean " + n + "?"
		}
		errs = append(errs, fmt.Errorf("config: acknowledgedChecks: no check named %q%s (checks: %s)", id, hint, strings.Join(known, ", ")))
	}
	return errors.Join(errs...)
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
