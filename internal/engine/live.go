package engine

import (
	"context"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Live is the backend of an agent that follows kube-proxy (`backend: auto`): a backend.Backend that
// forwards to the backend in use, which Engine.Follow replaces when kube-proxy's mode moves the
// backend. The engine and the fixes (their counters) hold the Live, so after a switch every call goes
// to the new backend; each switch gets a new backend, with a record of its own, built with nothing
// applied, so the first pass of every unit applies in full.
type Live struct {
	mu  sync.RWMutex
	cur backend.Backend
}

// NewLive returns a Live over be.
func NewLive(be backend.Backend) *Live { return &Live{cur: be} }

// Current is the backend in use.
func (l *Live) Current() backend.Backend {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.cur
}

func (l *Live) set(be backend.Backend) {
	l.mu.Lock()
	l.cur = be
	l.mu.Unlock()
}

// Name is the name of the backend in use.
func (l *Live) Name() string { return l.Current().Name() }

// Render renders with the backend in use.
func (l *Live) Render(rs *rules.Ruleset) (string, error) { return l.Current().Render(rs) }

// Reconcile reconciles with the backend in use.
func (l *Live) Reconcile(ctx context.Context, fix string, family rules.Family, desired *rules.Ruleset, mode backend.Mode) (backend.Result, error) {
	return l.Current().Reconcile(ctx, fix, family, desired, mode)
}

// Counters reads the counters of the backend in use.
func (l *Live) Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error) {
	return l.Current().Counters(ctx, fix, family)
}

// Cleanup cleans up with the backend in use.
func (l *Live) Cleanup(ctx context.Context) error { return l.Current().Cleanup(ctx) }
