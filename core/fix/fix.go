// Package fix is the contract between the core and fix modules.
//
// Every fix implements Fix (id, description, options, the watches it reads) and exactly one of:
//   - RuleFix: a pure function from a Snapshot of the cluster (and an IP family) to the rules it
//     wants. It never talks to the Kubernetes API or the kernel itself: the core watches the API,
//     calls Rules when something changed and hands the result to the rule backend.
//   - Actuator: a repair that is not a netfilter rule (a sysctl, conntrack entries). It changes the
//     node in Ensure and undoes it in Revert, through a seam the core injects (nodestate.Sysctl,
//     nodestate.Conntrack), so that unit tests can fake it.
package fix

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Snapshot is a consistent view of what fixes may look at: the tables the fix reads (Fix.Reads),
// each as its input module had it when the snapshot was built, and what the core knows about the
// node. Fixes read a table with its Get and must not modify what it returns.
type Snapshot struct {
	// Env is what the core knows about the node.
	Env    Env
	tables map[string]any
}

// NewSnapshot returns a snapshot of env and tables (table name → value of the table's type). The
// engine builds one per pass; tests build theirs with testkit.Snapshot.
func NewSnapshot(env Env, tables map[string]any) *Snapshot {
	return &Snapshot{Env: env, tables: tables}
}

// Clone returns a copy of s that a Table's Set changes without changing s (the values are shared).
func (s *Snapshot) Clone() *Snapshot {
	return &Snapshot{Env: s.Env, tables: maps.Clone(s.tables)}
}

// Table names an input: a table of the cluster of type T (the Services, this node's Node, …) that
// one input module provides, with a revision and a change feed. A fix lists the tables it reads in
// Spec.Reads and reads them from its Snapshot with Get. The name is the table's one id: in logs,
// errors and readiness ("waiting for Services").
type Table[T any] struct{ name string }

// NewTable returns the table called name (an input module declares it once, as a package variable).
func NewTable[T any](name string) Table[T] { return Table[T]{name: name} }

// Name is the table's name.
func (t Table[T]) Name() string { return t.name }

// Get returns the table's value in s: the zero T when s does not hold the table (the fix does not
// read it, or its input has nothing yet).
func (t Table[T]) Get(s *Snapshot) T {
	v, _ := s.tables[t.name].(T)
	return v
}

// Set puts v into s as the table's value (tests; the engine builds snapshots with NewSnapshot).
func (t Table[T]) Set(s *Snapshot, v T) {
	if s.tables == nil {
		s.tables = map[string]any{}
	}
	s.tables[t.name] = v
}

// TableRef is a Table of any type: what Spec.Reads lists.
type TableRef interface{ Name() string }

// ProxyModeNone is Env.ProxyMode on a node without kube-proxy (a CNI replaces it).
const ProxyModeNone = "none"

// Env describes the node the agent runs on.
type Env struct {
	// ProxyMode is kube-proxy's mode: "ipvs", "iptables", "nftables", ProxyModeNone when the node
	// has no kube-proxy, or "" when unknown. The agent follows kube-proxy: when the mode changes,
	// DefaultEnabled and Check are asked again with the new Env.
	ProxyMode string
	// NodeName is this node's name ("" when not configured).
	NodeName string
}

// Skip is an object a fix left out, with the reason (a short kebab-case word, used as metric label).
type Skip struct {
	Object string
	Reason string
	Detail string
}

// Report says what a Rules call covered and what it left out. The core logs skips and exports both.
type Report struct {
	// Covered counts the objects (e.g. Services) that got rules.
	Covered int
	// Items counts finer-grained things covered (e.g. external IPs), 0 if the fix has none.
	Items   int
	Skipped []Skip
}

// Fix is what every independently registered repair has: its identity, its options and the tables
// it reads. A fix is also exactly one of RuleFix (it wants netfilter rules) or Actuator (it changes other
// node state); the engine refuses a fix that is neither or both (see As).
type Fix interface {
	// ID is the fix's kebab-case id: its config key (fixes.<id>), metric label and log field.
	ID() string
	// Description is one line for `version`, logs and docs.
	Description() string
	// DefaultEnabled says whether the fix runs when the config does not say; env is what was detected.
	DefaultEnabled(env Env) bool
	// Configure validates and takes the fix's options (the keys under fixes.<id>, "enabled" removed).
	// It is called before the first sync and on every config change; on error the old options stay.
	Configure(options map[string]any) error
	// Reads lists the tables the fix reads: the engine watches only what running fixes read, waits
	// for them before the fix's first pass, and runs the fix again when one of them changed.
	Reads() []TableRef
}

// RuleFix is a fix whose repair is netfilter rules. The engine asks it for its rules in every
// configured family and hands them to the rule backend, one unit (worker) per family.
type RuleFix interface {
	Fix
	// Rules returns the rules the fix wants in family for snap. It must be pure and deterministic.
	// A nil ruleset means no rules: the backend then removes what the fix had in that family.
	Rules(snap *Snapshot, family rules.Family) (*rules.Ruleset, Report, error)
}

// Checker is implemented by fixes that must refuse to run in some environments (e.g. a DNAT fix that
// would break kube-proxy's iptables mode). The error explains why; the fix is then not run.
type Checker interface {
	Check(env Env) error
}

// Observer is implemented by fixes that export figures of their own. The core calls Observe after
// every successful sync of the fix in a family, outside any lock. For an Actuator it is called once
// per successful Ensure, with an empty family.
type Observer interface {
	Observe(ctx context.Context, family rules.Family, report Report)
}

// Actuator is a fix whose repair is node state other than netfilter rules (a sysctl, the conntrack
// table, a file, a route). The engine does not ask it for rules nor touch the rule backend for it: it
// runs one unit (worker) per Actuator, with no family, that calls Ensure once per sync pass and
// Revert when the fix is disabled. The engine's sync metrics (nnm_syncs_total,
// nnm_sync_errors_total, nnm_last_successful_sync_timestamp_seconds, nnm_sync_repairs_total) carry
// backend="node" and no family for an Actuator; a failed Ensure is retried with backoff like a
// failed reconcile, and counts against /healthz.
type Actuator interface {
	Fix
	// Ensure makes the node hold what the fix wants for snap. It must be idempotent. full is true on
	// the first pass, on periodic resyncs and on retries: the fix must then re-read the node's state
	// and restore what someone changed behind its back (saying so in Result.Repaired); when full is
	// false it may trust what it did last. Ensure must not start goroutines.
	Ensure(ctx context.Context, snap *Snapshot, full bool) (Result, error)
	// Revert undoes what Ensure did (e.g. puts a sysctl's previous value back). The engine calls it
	// for a disabled fix at start-up and after every config change, so it must be a cheap no-op when
	// there is nothing to undo. It is never called because the process exits: a restart must not
	// change the node.
	Revert(ctx context.Context) error
}

// As returns f as the one contract it implements: a RuleFix or an Actuator (the other is nil). A fix
// that implements neither or both is an error naming its id and Go type: the engine refuses to
// register it, and testkit's FixTree check fails on it.
func As(f Fix) (RuleFix, Actuator, error) {
	r, isRules := f.(RuleFix)
	a, isActuator := f.(Actuator)
	switch {
	case isRules && isActuator:
		return nil, nil, fmt.Errorf("fix %s (%T) implements both fix.RuleFix (Rules) and fix.Actuator (Ensure, Revert); a fix is one or the other", f.ID(), f)
	case !isRules && !isActuator:
		return nil, nil, fmt.Errorf("fix %s (%T) implements neither fix.RuleFix (Rules) nor fix.Actuator (Ensure, Revert)", f.ID(), f)
	}
	return r, a, nil
}

// Result is what one Ensure call did.
type Result struct {
	Report
	// Changed says Ensure changed the node's state (logged at info level).
	Changed bool
	// Repaired says a full Ensure found its state changed behind its back and restored it
	// (counted in nnm_sync_repairs_total and logged as a warning).
	Repaired bool
	// More says Ensure stopped at a bound with work left: the engine runs the next pass after
	// minSyncPeriod instead of waiting for a change or the next syncPeriod.
	More bool
}

// NodeBackend is the backend label of an Actuator's sync metrics.
const NodeBackend = "node"

// StateDir is the agent's directory on the node's tmpfs /run, mounted from the node by deploy/base
// (the "state" volume): the agent's node-local lock, and state a fix remembers across restarts
// (conntrack-liberal keeps the sysctl value it found there).
const StateDir = "/run/network-node-manager"

// Module registers a fix with the agent, in an fx module named after spec.ID: the id (known before
// any fix is constructed, so that the configuration can be checked against the registered ids) and
// the fix's constructor, whose fix joins the "fixes" value group. A fix's cell.go says it once:
//
//	var Module = fix.Module(spec, New)
func Module[C, S any, F Fix](spec Spec[C, S], New func(Params) (F, error)) fx.Option {
	opts := []fx.Option{
		fx.Supply(fx.Annotated{Group: "fix-ids", Target: spec.ID}),
		fx.Provide(fx.Annotate(New, fx.As(new(Fix)), fx.ResultTags(`group:"fixes"`))),
	}
	if spec.LegacyEnabledEnv != "" {
		opts = append(opts, fx.Supply(fx.Annotated{Group: "fix-legacy-env", Target: Legacy{Fix: spec.ID, Env: spec.LegacyEnabledEnv}}))
	}
	return fx.Module(spec.ID, opts...)
}

// Legacy is an environment variable of the predecessor (Kakao network-node-manager) that sets a
// fix's enabled (Spec.LegacyEnabledEnv), honoured so that users can migrate without editing their
// manifests; NNM_FIXES_<ID>_ENABLED wins over it.
type Legacy struct {
	Fix string
	Env string
}

// IDs is embedded by constructors that need the registered fix ids (e.g. the config loader), and
// the fixes' legacy variables.
type IDs struct {
	fx.In
	IDs    []string `group:"fix-ids"`
	Legacy []Legacy `group:"fix-legacy-env"`
}

// In is embedded by constructors that receive all registered fixes.
type In struct {
	fx.In
	Fixes []Fix `group:"fixes"`
}

// Decode fills out (a pointer to a struct holding defaults) from options. Unknown keys and values of
// the wrong kind are errors (OptionError, one per option, joined) that show the value and what is
// accepted. Durations accept "5s"; string lists accept "a,b".
func Decode(options map[string]any, out any) error {
	fields, names := optionFields(reflect.TypeOf(out).Elem())
	var errs []error
	keys := make([]string, 0, len(options))
	for k := range options {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f, ok := fields[NormalizeKey(k)]
		if !ok {
			errs = append(errs, UnknownOption(k, append([]string{"enabled"}, names...)))
		} else if p := ValueProblem(options[k], f.Type); p != "" {
			errs = append(errs, &OptionError{Key: k, Problem: p})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:           out,
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		MatchName:        func(key, field string) bool { return NormalizeKey(key) == NormalizeKey(field) },
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
			stringToUint32Hook,
		),
	})
	if err != nil {
		return err
	}
	if err := dec.Decode(options); err != nil {
		return DecodeError(err)
	}
	return nil
}

// DecodeError turns what mapstructure reports into one OptionError per problem, named by the key and
// without Go type names (ValueProblem catches the usual ones before decoding; this is the rest).
func DecodeError(err error) error {
	var errs []error
	for _, e := range ErrorLeaves(err) {
		var de *mapstructure.DecodeError
		if errors.As(e, &de) {
			e = &OptionError{Key: de.Name(), Problem: "this value cannot be read as the option (see its documentation)"}
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// NormalizeKey is the one spelling under which option keys compare (Decode, Nearest and the
// configuration's own decoder): lower case without '-' and '_', so maxEntries, max-entries and
// MAX_ENTRIES (an environment variable's) are one key.
//
// It allocates nothing for a key already so spelled: a config file's every option key goes through
// it (issue #63: a replacer built per call was 260 MB of one load of a 1 MiB file).
func NormalizeKey(s string) string {
	return strings.ToLower(keySeparators.Replace(s))
}

// keySeparators removes what NormalizeKey ignores; built once (a Replacer is safe for concurrent use).
var keySeparators = strings.NewReplacer("-", "", "_", "")

// stringToUint32Hook parses hexadecimal strings such as "0x4000" into integers.
func stringToUint32Hook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Uint32 {
		return data, nil
	}
	var v uint32
	s := strings.TrimSpace(data.(string))
	if _, err := fmt.Sscanf(s, "%v", &v); err != nil {
		return nil, fmt.Errorf("%q is not a number", s)
	}
	return v, nil
}
