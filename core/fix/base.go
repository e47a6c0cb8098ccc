package fix

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Params is what the core injects into a fix's constructor (an fx parameter object): the seams
// through which a fix reads or changes the node, the registry for its metrics and a logger. A fix
// uses the fields it needs; a unit test sets only those (testkit.FixEnv sets them all, faked).
type Params struct {
	fx.In
	// Backend is the rule backend; fixes read their rule counters through it (rulecounters).
	Backend backend.Backend
	// Sysctl reads and writes /proc/sys of the node's network namespace.
	Sysctl nodestate.Sysctl
	// Conntrack lists and deletes conntrack entries of the node's network namespace.
	Conntrack nodestate.Conntrack
	// Registry is where the fix registers its metrics (Base.Init does); nil registers nothing.
	Registry prometheus.Registerer
	// Logger is the agent's logger; nil means slog.Default(). Base.Init adds the field fix=<id>.
	Logger *slog.Logger `optional:"true"`
	// Limits are the agent's resource limits (config memoryLimit), from which budgets are derived
	// (BudgetFor); the zero value is the DaemonSet's.
	Limits Limits `optional:"true"`
}

// Spec declares what a fix is besides its repair: its identity, its options and what it reads. C is
// the struct its options decode into (the keys under fixes.<ID>, with mapstructure tags); S is what
// Parse makes of a decoded C (C itself when Parse only validates).
//
//	var spec = fix.Spec[Config, settings]{
//		ID: ID, Description: "…", Default: defaultConfig, Parse: parse,
//		Reads: []fix.TableRef{inputs.PodCIDRs},
//	}
type Spec[C, S any] struct {
	// ID is the kebab-case fix id (Fix.ID).
	ID string
	// Description is one line for `version`, logs and docs (Fix.Description).
	Description string
	// Default returns the configuration used when nothing is set: a new value on every call, as
	// options are decoded over it. Nil means the zero C.
	Default func() C
	// Parse validates a decoded configuration and returns what the fix works with; its errors are
	// OptionErrors naming the option by its key (Invalid, OptionErr), to which Settings adds the
	// fix's id and the configuration where it was set. Nil takes C as it is (S must then be C).
	Parse func(C) (S, error)
	// Reads lists the tables the fix reads (Fix.Reads).
	Reads []TableRef
	// DefaultEnabled says whether the fix runs when the configuration does not say (Fix.DefaultEnabled);
	// nil means it does not.
	DefaultEnabled func(Env) bool
	// LegacyEnabledEnv is the predecessor's environment variable that enabled this fix (e.g.
	// RULE_DROP_INVALID_INPUT_ENABLE), honoured below NNM_FIXES_<ID>_ENABLED; empty for none.
	LegacyEnabledEnv string
}

// Base implements Fix (ID, Description, DefaultEnabled, Reads, Configure) from a Spec, holds the
// validated options (Config) and the fix's logger. A fix embeds it and adds only what is its own:
// Rules (a RuleFix) or Ensure and Revert (an Actuator), and the optional Checker and Observer.
//
//	type Fix struct {
//		fix.Base[Config, settings]
//	}
//
//	func New(p fix.Params) (*Fix, error) {
//		f := &Fix{}
//		if err := f.Init(spec, p, newMetrics(p.Backend)...); err != nil {
//			return nil, err
//		}
//		return f, nil
//	}
type Base[C, S any] struct {
	spec Spec[C, S]
	opts *Settings[C, S]
	// Log is the injected logger with the field fix=<id>.
	Log *slog.Logger
}

// Init takes spec, checks it and its defaults, sets Log from p.Logger and registers collectors on
// p.Registry (when set). A fix's constructor calls it once, after building what the collectors
// read. Errors name the fix.
func (b *Base[C, S]) Init(spec Spec[C, S], p Params, collectors ...prometheus.Collector) error {
	if !rules.ValidFixID(spec.ID) {
		return fmt.Errorf("fix id %q is not kebab-case (lower-case letters, digits and dashes)", spec.ID)
	}
	if spec.Description == "" {
		return fmt.Errorf("fix %s: its fix.Spec needs a Description", spec.ID)
	}
	def := spec.Default
	if def == nil {
		def = func() C { var zero C; return zero }
	}
	parse := spec.Parse
	if parse == nil {
		if reflect.TypeFor[C]() != reflect.TypeFor[S]() {
			return fmt.Errorf("fix %s: its fix.Spec has no Parse, so its settings type %v must be its config type %v", spec.ID, reflect.TypeFor[S](), reflect.TypeFor[C]())
		}
		parse = func(c C) (S, error) { return any(c).(S), nil }
	}
	opts, err := NewSettings(spec.ID, def, parse)
	if err != nil {
		return err
	}
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	b.spec, b.opts, b.Log = spec, opts, log.With("fix", spec.ID)
	if p.Registry != nil {
		if err := metrics.Register(p.Registry, collectors...); err != nil {
			return fmt.Errorf("%s: %w", spec.ID, err)
		}
	}
	return nil
}

// ID is the fix id of the Spec.
func (b *Base[C, S]) ID() string { return b.spec.ID }

// Description is the one line of the Spec.
func (b *Base[C, S]) Description() string { return b.spec.Description }

// DefaultEnabled is the Spec's DefaultEnabled for env; false when the Spec has none.
func (b *Base[C, S]) DefaultEnabled(env Env) bool {
	return b.spec.DefaultEnabled != nil && b.spec.DefaultEnabled(env)
}

// Reads is the Spec's Reads.
func (b *Base[C, S]) Reads() []TableRef { return b.spec.Reads }

// Configure decodes options over the Spec's defaults and parses them; on error the previous
// configuration stays.
func (b *Base[C, S]) Configure(options map[string]any) error {
	if b.opts == nil {
		return errNotInitialized
	}
	return b.opts.Configure(options)
}

// Config returns the current parsed configuration.
func (b *Base[C, S]) Config() S { return b.opts.Get() }

var errNotInitialized = errors.New("fix.Base used before Init (call it from the fix's constructor)")
