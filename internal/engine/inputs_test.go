package engine

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// memInput is an in-memory inputs.Input of one table: set changes it (and moves its revision).
type memInput struct {
	table fix.TableRef

	mu       sync.Mutex
	val      any
	starts   int
	startErr error // what Start returns
	unsynced error // what Synced returns once started (nil: synced)
	hub      inputs.Source
	rev      atomic.Uint64
}

func newMemInput(t fix.TableRef) *memInput { return &memInput{table: t} }

func (m *memInput) Table() fix.TableRef { return m.table }
func (m *memInput) Start(h inputs.Source) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.starts++
	if m.startErr != nil {
		return m.startErr
	}
	m.hub = h
	return nil
}
func (m *memInput) Synced() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hub == nil {
		return errors.New(m.table.Name() + " (not started)")
	}
	return m.unsynced
}
func (m *memInput) Revision() uint64 { return m.rev.Load() }
func (m *memInput) Value() any {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.val
}

// set makes v the table's value and tells the engine.
func (m *memInput) set(v any) { m.update(func() { m.val = v }) }

// setSynced says whether the input has its first state (err: why not).
func (m *memInput) setSynced(err error) { m.update(func() { m.unsynced = err }) }

// update changes the input with change, moves its revision and tells the engine.
func (m *memInput) update(change func()) {
	m.mu.Lock()
	change()
	hub := m.hub
	m.mu.Unlock()
	m.rev.Add(1)
	if hub != nil {
		hub.Changed()
	}
}

func (m *memInput) startCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.starts
}

// memSource is the tables the engine tests read, in memory, on a hub without an API client.
type memSource struct {
	hub                                   *watch.Hub
	services, node, pods, cidrs, podCIDRs *memInput
}

func newMemSource() *memSource {
	return &memSource{hub: watch.Offline(slog.New(slog.DiscardHandler)),
		services: newMemInput(inputs.Services), node: newMemInput(inputs.Node), pods: newMemInput(inputs.Pods),
		cidrs: newMemInput(inputs.ServiceCIDRs), podCIDRs: newMemInput(inputs.PodCIDRs)}
}

func (s *memSource) ins() []inputs.Input {
	return []inputs.Input{s.services, s.node, s.pods, s.cidrs, s.podCIDRs}
}

// set makes svcs the Services.
func (s *memSource) set(svcs ...*fix.Service) { s.services.set(svcs) }

// stopped says whether the engine stopped the hub.
func (s *memSource) stopped() bool {
	_, err := s.hub.Client()
	return err != nil && !errors.Is(err, watch.ErrNoAPI)
}
