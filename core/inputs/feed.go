package inputs

import (
	"errors"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
)

// Feed is what an Input filled by one informer keeps: the informer, started once, its cache and
// whether it has listed, and the table's revision, moved (and the runtime signalled) on every event.
// An input embeds it and adds Table and Value.
type Feed struct {
	mu     sync.Mutex
	store  cache.Store
	synced cache.InformerSynced
	// unwatchable is why the informer cannot run ("no node name"); Synced reports it.
	unwatchable string
	rev         atomic.Uint64
}

// Watch starts, on the first call, the informer of r (only the objects fieldSelector selects) on s,
// with transform (nil: none); onEvent (nil: none) hears each object as it arrives, with deleted set
// for a deletion, before the revision moves.
func (f *Feed) Watch(s Source, r Resource, fieldSelector string, transform cache.TransformFunc, onEvent func(obj any, deleted bool)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.synced != nil {
		return nil
	}
	event := func(obj any, deleted bool) {
		if onEvent != nil {
			onEvent(obj, deleted)
		}
		f.Moved(s)
	}
	store, synced, err := s.Informer(r, fieldSelector, transform, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { event(obj, false) },
		UpdateFunc: func(_, cur any) { event(cur, false) },
		DeleteFunc: func(obj any) { event(obj, true) },
	})
	if err != nil {
		return err
	}
	f.store, f.synced = store, synced
	f.rev.Add(1)
	return nil
}

// Unwatchable records why the informer cannot run (Synced then reports it).
func (f *Feed) Unwatchable(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unwatchable = why
}

// Moved moves the revision and signals the runtime (a change the input made itself).
func (f *Feed) Moved(s Source) {
	f.rev.Add(1)
	s.Changed()
}

// Synced returns nil once the informer has listed; the error names the table (name).
func (f *Feed) Synced(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.unwatchable != "":
		return errors.New(name + " (" + f.unwatchable + ")")
	case f.synced == nil:
		return errors.New(name + " (not started)")
	case !f.synced():
		return errors.New(name)
	}
	return nil
}

// Revision is the table's revision.
func (f *Feed) Revision() uint64 { return f.rev.Load() }

// Store is the informer's cache, nil before Watch.
func (f *Feed) Store() cache.Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.store
}

// Configured is a value an input takes from the configuration (Configurable: a configured
// fallback), with a revision that moves on every Set.
type Configured[T any] struct {
	v   atomic.Pointer[T]
	rev atomic.Uint64
}

// Set takes v.
func (c *Configured[T]) Set(v T) {
	c.v.Store(&v)
	c.rev.Add(1)
}

// Get returns the value, the zero T before the first Set.
func (c *Configured[T]) Get() T {
	if p := c.v.Load(); p != nil {
		return *p
	}
	var zero T
	return zero
}

// Revision counts the Sets.
func (c *Configured[T]) Revision() uint64 { return c.rev.Load() }
