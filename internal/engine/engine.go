// Package engine keeps the kernel in the state the enabled fixes ask for.
//
// The work is cut into units: the rules of one fix.RuleFix in one family, or the node state of one
// fix.Actuator. Each unit has a worker of its own (scheduler.go), so a unit blocked by the kernel
// (the xtables lock held) or waiting for the API server never delays another: a fix that reads no
// watch is programmed at once, without an API server. A worker coalesces changes, applies them at
// most once per minSyncPeriod, verifies the kernel every syncPeriod (a Verify reconcile, which a
// change preempts) and retries failures with backoff; the rules applied before stay in place.
// Rules are never removed because the process exits; a disabled fix's rules are removed at start
// and when the config changes.
//
// The files follow the jobs: registry.go (fixes, config, which units are wanted), scheduler.go
// (workers: coalescing, backoff, resync, preemption), reconciler.go (one pass of one unit against
// the backend), status.go (health, readiness, liveness, statuses and plan).
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"k8s.io/utils/clock"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/waitgroup"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Options are the engine's collaborators.
type Options struct {
	Fixes   []fix.Fix
	Backend backend.Backend
	// Inputs provide the tables the fixes read (fix.Fix.Reads), on Hub.
	Inputs  []inputs.Input
	Hub     *watch.Hub
	Config  *config.Config
	Env     fix.Env
	Metrics *metrics.Sync
	Log     *slog.Logger
	// Notify hears about fixes enabled, refused, synced or failing (nil: nobody).
	Notify Notifier
	// Clock is what the engine waits on and reads the time from (nil: the real clock); tests step
	// a fake one (k8s.io/utils/clock/testing).
	Clock clock.WithTicker
	// Now, when set, replaces Clock.Now alone (tests that move the time health reads while the
	// workers wait on the real clock).
	Now func() time.Time
}

// Engine runs the workers. Create it with New, then Start and Stop it (fx lifecycle).
type Engine struct {
	be     backend.Backend
	hub    *watch.Hub
	ins    []inputs.Input
	m      *metrics.Sync
	log    *slog.Logger
	notify Notifier
	now    func() time.Time
	clock  clock.WithTicker

	reconfig chan *config.Config

	mu       sync.Mutex // guards everything below and the units' status fields
	cfg      *config.Config
	cfgGen   uint64 // counts the configurations taken (configure)
	env      fix.Env
	families []rules.Family
	// inputsStarted are the inputs whose Start succeeded.
	inputsStarted map[inputs.Input]bool
	fixes         []*fixState
	units         []*unit
	started       time.Time
	// watchErr is why the watches could not be started (nil when they were).
	watchErr error

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New validates the options and configures every fix. It does no I/O.
func New(o Options) (*Engine, error) {
	if o.Backend == nil || o.Hub == nil || o.Config == nil || o.Metrics == nil {
		return nil, errors.New("engine: backend, hub, config and metrics are required")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Now == nil {
		o.Now = o.Clock.Now
	}
	if o.Notify == nil {
		o.Notify = nopNotifier{}
	}
	e := &Engine{be: o.Backend, hub: o.Hub, ins: o.Inputs, m: o.Metrics, log: o.Log, now: o.Now, clock: o.Clock, notify: o.Notify,
		reconfig: make(chan *config.Config, 1), env: o.Env, inputsStarted: map[inputs.Input]bool{}}
	byTable, err := indexInputs(o.Inputs)
	if err != nil {
		return nil, err
	}
	for _, f := range o.Fixes {
		st, err := register(f, e.fixes, byTable)
		if err != nil {
			return nil, err
		}
		e.fixes = append(e.fixes, st)
	}
	// Value groups arrive in random order: sort so that logs, metrics and sync order are stable.
	slices.SortFunc(e.fixes, func(a, b *fixState) int { return strings.Compare(a.fix.ID(), b.fix.ID()) })
	for _, st := range e.fixes {
		e.units = append(e.units, st.units...)
	}
	if err := e.configure(o.Config); err != nil {
		return nil, err
	}
	return e, nil
}

// Configure takes cfg in place of the configuration New took, before Start: for a configuration
// known only once the graph is built (the agent's, once this node's labels have chosen its
// nodeOverrides entry). Every fix validates its options as in New; after Start, Reconfigure.
func (e *Engine) Configure(cfg *config.Config) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started.IsZero() {
		return errors.New("engine: Configure after Start; use Reconfigure")
	}
	return e.configure(cfg)
}

// Start starts the watches and one worker per unit. It returns at once. Watches that cannot be
// started (no API client) are logged; the fixes that need them wait, the others run.
func (e *Engine) Start(ctx context.Context) error {
	for _, err := range e.Refusals() {
		e.log.Error("fix not started", "err", err)
	}
	e.announce(nil)
	e.mu.Lock()
	e.started = e.now()
	for _, u := range e.units {
		u.beat = e.started
	}
	reads := e.readLocked()
	e.mu.Unlock()
	// The workers outlive the Start hook's context: they have their own, cancelled by Stop.
	loopCtx, cancel := context.WithCancel(context.Background())
	if _, err := e.startInputs(reads); err != nil {
		e.log.Error("cannot start the watches; fixes that read the API wait, the others run", "err", err)
		e.mu.Lock()
		e.watchErr = fmt.Errorf("watches not started: %w", err)
		e.mu.Unlock()
	}
	e.cancel = cancel
	e.wg.Add(1 + len(e.units))
	go func() {
		defer e.wg.Done()
		e.dispatch(loopCtx)
	}()
	for _, u := range e.units {
		go func() {
			defer e.wg.Done()
			e.work(loopCtx, u)
		}()
	}
	return nil
}

// Stop ends the workers and the watches (also those Load started) and waits for them. Rules stay in
// the kernel.
func (e *Engine) Stop(ctx context.Context) error {
	if e.cancel == nil {
		e.hub.Stop() // inputs that Load started
		return nil
	}
	e.cancel()
	if !waitgroup.Until(&e.wg, ctx.Done()) {
		return ctx.Err()
	}
	e.hub.Stop()
	return nil
}

// Reconfigure hands a new configuration to the engine (e.g. after the config file changed).
func (e *Engine) Reconfigure(cfg *config.Config) {
	select {
	case <-e.reconfig:
	default:
	}
	e.reconfig <- cfg
}
