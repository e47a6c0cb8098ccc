package services

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// sortedServices keeps the Services of the informer's events sorted by namespace/name, so that a
// snapshot after one event costs one merge of that event into the previous list (no listing and
// sorting of all Services per sync). The published slice is never modified: a snapshot keeps the
// list it got, and a Service whose event has not arrived is the same object as before, which is what
// lets fixes recompute only the Services that changed (fix.ServiceMap).
type sortedServices struct {
	mu      sync.Mutex
	sorted  []*fix.Service
	pending map[svcKey]*fix.Service // the latest object per key since the last list; nil: deleted
}

type svcKey struct{ namespace, name string }

// set takes one informer event: the Service obj, deleted or not.
func (s *sortedServices) set(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	cached, ok := obj.(*cachedService)
	if !ok {
		return
	}
	svc := (*fix.Service)(cached)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		s.pending = map[svcKey]*fix.Service{}
	}
	k := svcKey{svc.Namespace, svc.Name}
	if deleted {
		s.pending[k] = nil
	} else {
		s.pending[k] = svc
	}
}

// list returns the current Services, merging the events received since the last call.
func (s *sortedServices) list() []*fix.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return s.sorted
	}
	keys := make([]svcKey, 0, len(s.pending))
	for k := range s.pending {
		keys = append(keys, k)
	}
	compareKeys := func(a, b svcKey) int {
		return cmp.Or(strings.Compare(a.namespace, b.namespace), strings.Compare(a.name, b.name))
	}
	slices.SortFunc(keys, compareKeys)
	old := s.sorted
	out := make([]*fix.Service, 0, len(old)+len(keys))
	i := 0
	for _, k := range keys {
		for i < len(old) && compareKeys(svcKey{old[i].Namespace, old[i].Name}, k) < 0 {
			out = append(out, old[i])
			i++
		}
		if i < len(old) && compareKeys(svcKey{old[i].Namespace, old[i].Name}, k) == 0 {
			i++ // replaced or deleted
		}
		if svc := s.pending[k]; svc != nil {
			out = append(out, svc)
		}
	}
	s.sorted = slices.Clip(append(out, old[i:]...))
	s.pending = nil // a cleared map would keep the buckets of the first list (10,000 Services) forever
	return s.sorted
}
