package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// The engine knows inputs only as inputs.Input: a fix's Reads name tables, each resolved once (at
// New) to the input that provides it. Which units to wake and whether what a unit reads changed
// both come from the inputs' revisions (revision); whether a unit may act from their Synced.

// resolveReads returns the inputs of the tables f reads, sorted by table name, or an error naming
// a table no input module provides.
func resolveReads(f fix.Fix, byTable map[string]inputs.Input) ([]inputs.Input, error) {
	var out []inputs.Input
	for _, t := range f.Reads() {
		in, ok := byTable[t.Name()]
		if !ok {
			return nil, fmt.Errorf("engine: fix %s reads the table %s, which no input module provides", f.ID(), t.Name())
		}
		if !slices.Contains(out, in) {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, compareInputs)
	return out, nil
}

func compareInputs(a, b inputs.Input) int { return strings.Compare(a.Table().Name(), b.Table().Name()) }

// indexInputs maps table names to their inputs; two inputs of one table are an error.
func indexInputs(ins []inputs.Input) (map[string]inputs.Input, error) {
	byTable := map[string]inputs.Input{}
	for _, in := range ins {
		name := in.Table().Name()
		if other, ok := byTable[name]; ok {
			return nil, fmt.Errorf("engine: the table %s is provided twice (%T and %T)", name, other, in)
		}
		byTable[name] = in
	}
	return byTable, nil
}

// configureInputs hands cfg's settings to the inputs that read the configuration.
func configureInputs(ins []inputs.Input, cfg *config.Config) {
	s := InputSettings(cfg)
	for _, in := range ins {
		if c, ok := in.(inputs.Configurable); ok {
			c.Configure(s)
		}
	}
}

// InputSettings is what inputs read of cfg, which is already validated.
func InputSettings(cfg *config.Config) inputs.Settings {
	pod, _ := cfg.ParsedPodCIDRs()
	svc, _ := cfg.ParsedServiceCIDRs()
	return inputs.Settings{PodCIDRs: pod, ServiceCIDRs: svc}
}

// readLocked is the inputs the enabled fixes read, sorted by table name. Call with e.mu held.
func (e *Engine) readLocked() []inputs.Input {
	var out []inputs.Input
	for _, st := range e.fixes {
		if !st.enabled {
			continue
		}
		for _, in := range st.reads {
			if !slices.Contains(out, in) {
				out = append(out, in)
			}
		}
	}
	slices.SortFunc(out, compareInputs)
	return out
}

// startInputs starts the inputs of ins not started yet and returns those it started; on error the
// ones started before stay started (they are harmless: nothing reads them).
func (e *Engine) startInputs(ins []inputs.Input) (started []inputs.Input, err error) {
	for _, in := range ins {
		e.mu.Lock()
		done := e.inputsStarted[in]
		e.mu.Unlock()
		if done {
			continue
		}
		if err := in.Start(e.hub); err != nil {
			return started, fmt.Errorf("%s: %w", in.Table().Name(), err)
		}
		e.mu.Lock()
		e.inputsStarted[in] = true
		e.mu.Unlock()
		started = append(started, in)
	}
	return started, nil
}

// revision numbers the state of what ins hold: it differs from every earlier one once any of them
// changed (each input's revision only grows).
func revision(ins []inputs.Input) uint64 {
	var v uint64
	for _, in := range ins {
		v += in.Revision()
	}
	return v
}

// inputsSynced returns nil when every input of ins holds its first complete state, else why not.
func inputsSynced(ins []inputs.Input) error {
	var missing []string
	for _, in := range ins {
		if err := in.Synced(); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return errors.New("watches not synced: " + strings.Join(missing, ", "))
	}
	return nil
}

// snapshot builds the view of ins: each table as its input holds it now, and what the engine knows
// about the node.
func (e *Engine) snapshot(ins []inputs.Input) *fix.Snapshot {
	e.mu.Lock()
	env := e.env
	e.mu.Unlock()
	tables := make(map[string]any, len(ins))
	for _, in := range ins {
		tables[in.Table().Name()] = in.Value()
	}
	return fix.NewSnapshot(env, tables)
}

// Snapshot builds the view that the enabled fixes see now.
func (e *Engine) Snapshot() *fix.Snapshot {
	e.mu.Lock()
	ins := e.readLocked()
	e.mu.Unlock()
	return e.snapshot(ins)
}

// Reads names the tables the enabled fixes read, sorted.
func (e *Engine) Reads() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return tableNames(e.readLocked())
}

func tableNames(ins []inputs.Input) []string {
	out := make([]string, 0, len(ins))
	for _, in := range ins {
		out = append(out, in.Table().Name())
	}
	return out
}

// describe names the tables of ins: "Node, Services" ("none" for none).
func describe(ins []inputs.Input) string {
	if len(ins) == 0 {
		return "none"
	}
	return strings.Join(tableNames(ins), ", ")
}

// wake kicks the workers of the units whose inputs changed since the last wake.
func (e *Engine) wake() {
	for _, u := range e.units {
		v := revision(u.st.reads)
		e.mu.Lock()
		changed := v != u.seen
		u.seen = v
		e.mu.Unlock()
		if changed {
			signal(u.kick)
		}
	}
}

// Load starts the inputs the enabled fixes read and waits until they hold their first state, for
// callers that run passes themselves (SyncOnce, Plan) instead of Start's workers. It returns why
// not when ctx ends first.
func (e *Engine) Load(ctx context.Context) error {
	e.mu.Lock()
	ins := e.readLocked()
	e.mu.Unlock()
	if _, err := e.startInputs(ins); err != nil {
		return fmt.Errorf("watches not started: %w", err)
	}
	return e.waitSynced(ctx, ins)
}

// waitSynced waits until every input of ins holds its first state, or ctx ends (then why not).
func (e *Engine) waitSynced(ctx context.Context, ins []inputs.Input) error {
	tick := e.clock.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := inputsSynced(ins)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", err, ctx.Err())
		case <-tick.C():
		}
	}
}
