package conntrack

import (
	"context"
	"slices"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Fake is an in-memory conntrack table for unit tests. It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	entries []Entry
	// Dumps counts ListDNAT calls per family; Deleted lists what Delete removed, in order.
	Dumps   map[rules.Family]int
	Deleted []Entry
	// ListErr and DeleteErr, when set, make the calls fail.
	ListErr, DeleteErr error
}

var _ Interface = (*Fake)(nil)

// NewFake returns a table holding entries.
func NewFake(entries ...Entry) *Fake {
	return &Fake{entries: slices.Clone(entries), Dumps: map[rules.Family]int{}}
}

// Add adds entries, as traffic would.
func (f *Fake) Add(entries ...Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = append(f.entries, entries...)
}

// Entries returns what the table holds.
func (f *Fake) Entries() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.entries)
}

// ListDNAT returns the entries of family whose reply source differs from the original destination.
func (f *Fake) ListDNAT(ctx context.Context, family rules.Family) ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Dumps[family]++
	if f.ListErr != nil {
		return nil, f.ListErr
	}
	var out []Entry
	for _, e := range f.entries {
		if e.Family == family && e.Reply.Src != e.Orig.Dst {
			out = append(out, e)
		}
	}
	return out, nil
}

// Delete removes the entries that are in the table.
func (f *Fake) Delete(ctx context.Context, entries []Entry) (int, error) {
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
