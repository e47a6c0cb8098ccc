package nodestate

import (
	"context"
	"slices"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// FakeConntrack is an in-memory conntrack table for unit tests. It is safe for concurrent use.
type FakeConntrack struct {
	mu      sync.Mutex
	entries []ConntrackEntry
	// Dumps counts EachDNAT calls per family; Deleted lists what Delete removed, in order.
	Dumps   map[rules.Family]int
	Deleted []ConntrackEntry
	// ListErr and DeleteErr, when set, make the calls fail.
	ListErr, DeleteErr error
}

var _ Conntrack = (*FakeConntrack)(nil)

// NewFakeConntrack returns a table holding entries.
func NewFakeConntrack(entries ...ConntrackEntry) *FakeConntrack {
	return &FakeConntrack{entries: slices.Clone(entries), Dumps: map[rules.Family]int{}}
}

// Add adds entries, as traffic would.
func (f *FakeConntrack) Add(entries ...ConntrackEntry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = append(f.entries, entries...)
}

// Entries returns what the table holds.
func (f *FakeConntrack) Entries() []ConntrackEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.entries)
}

// EachDNAT hands fn the entries of family and protocol whose reply source differs from the original
// destination, in table order, until fn returns false.
func (f *FakeConntrack) EachDNAT(ctx context.Context, family rules.Family, protocol rules.Protocol, fn func(ConntrackEntry) bool) error {
	f.mu.Lock()
	f.Dumps[family]++
	err := f.ListErr
	entries := slices.Clone(f.entries)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Family == family && e.Protocol == protocol && e.Reply.Src != e.Orig.Dst {
			if !fn(e) {
				return nil
			}
		}
	}
	return nil
}

// Delete removes the entries that are in the table.
func (f *FakeConntrack) Delete(ctx context.Context, entries []ConntrackEntry) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.DeleteErr != nil {
		return 0, f.DeleteErr
	}
	n := 0
	for _, d := range entries {
		if i := slices.Index(f.entries, d); i >= 0 {
			f.entries = slices.Delete(f.entries, i, i+1)
			f.Deleted = append(f.Deleted, d)
			n++
		}
	}
	return n, nil
}
