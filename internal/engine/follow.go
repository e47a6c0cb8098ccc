package engine

import (
	"fmt"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
)

// Follow takes what a re-detection found while the agent runs (kube-proxy's mode changed): env is
// what the fixes are judged by from now on (DefaultEnabled and Check are asked again), and be, when
// not nil, the backend to switch to (`backend: auto` follows the mode; the engine's backend must then
// be a *Live). Every unit gets a full pass at once: a fix the new mode refuses has its rules removed
// (and a fix that ran by default only is reported refused, with its Check's reason, in nnm_fix_refused,
// Statuses and a FixRefused Event, until it runs again); with a new backend every wanted unit applies
// its rules there. What the old backend holds is not removed here: agent.Takeover removes it fix by
// fix once the fix has synced with the new one (make before break), as after a switch between runs.
func (e *Engine) Follow(env fix.Env, be backend.Backend) error {
	live, _ := e.be.(*Live)
	if be != nil && live == nil {
		return fmt.Errorf("engine: cannot switch to the %s backend while running: the engine's backend is %T, not an *engine.Live", be.Name(), e.be)
	}
	before := e.Statuses()
	e.mu.Lock()
	ran := map[*fixState]bool{}
	for _, st := range e.fixes {
		ran[st] = st.enabled
	}
	e.env = env
	if be != nil {
		if old := live.Current().Name(); old != be.Name() {
			// The old backend's gauges would read as stale rules and a stale last sync.
			e.m.Rules.DeletePartialMatch(map[string]string{"backend": old})
			e.m.LastSuccess.DeletePartialMatch(map[string]string{"backend": old})
		}
		live.set(be)
	}
	// The snapshot carries the Env: computed rules are stale.
	e.cfgGen++
	e.evaluateLocked()
	var stopped []*fixState
	for _, st := range e.fixes {
		if !ran[st] || st.enabled {
			continue
		}
		stopped = append(stopped, st)
		if c, ok := st.fix.(fix.Checker); ok && st.refusal == nil {
			if err := c.Check(env); err != nil {
				st.envRefusal = fmt.Errorf("fix %s refused: %w", st.fix.ID(), err)
				st.refusal = st.envRefusal
				e.m.Refused.WithLabelValues(st.fix.ID()).Set(1)
			}
		}
	}
	e.mu.Unlock()
	for _, st := range stopped {
		e.mu.Lock()
		refusal := st.refusal
		e.mu.Unlock()
		if refusal != nil {
			e.log.Error("kube-proxy's mode changed: fix refused, removing its rules", "fix", st.fix.ID(), "proxyMode", env.ProxyMode, "err", refusal)
		} else {
			e.log.Warn("kube-proxy's mode changed: fix no longer enabled by default, removing its rules", "fix", st.fix.ID(), "proxyMode", env.ProxyMode)
		}
	}
	e.announce(before)
	for _, u := range e.units {
		signal(u.reconf)
	}
	return nil
}

// Env is what the fixes are judged by now.
func (e *Engine) Env() fix.Env {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.env
}
