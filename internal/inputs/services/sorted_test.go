package services

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

func names(svcs []*fix.Service) []string {
	var out []string
	for _, s := range svcs {
		out = append(out, s.Namespace+"/"+s.Name)
	}
	return out
}

// TestSortedServicesMergesEvents: after random adds, updates and deletes (also in batches between two
// lists), the list equals the sorted set of the latest objects, untouched objects keep their
// identity, and lists handed out earlier stay as they were.
func TestSortedServicesMergesEvents(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var s sortedServices
	want := map[string]*fix.Service{}
	type handed struct {
		list []*fix.Service
		keys []string
	}
	var lists []handed
	for step := range 2000 {
		ns, name := fmt.Sprint("ns", rng.IntN(3)), fmt.Sprint("s", rng.IntN(40))
		key := ns + "/" + name
		switch rng.IntN(4) {
		case 0:
			delete(want, key)
			var obj any = &cachedService{Namespace: ns, Name: name}
			if rng.IntN(2) == 0 {
				obj = cache.DeletedFinalStateUnknown{Key: key, Obj: obj}
			}
			s.set(obj, true)
		default:
			svc := &fix.Service{Namespace: ns, Name: name, ResourceVersion: fmt.Sprint(step)}
			want[key] = svc
			s.set((*cachedService)(svc), false)
		}
		if rng.IntN(5) != 0 {
			continue // several events between two lists
		}
		got := s.list()
		var wantList []*fix.Service
		for _, svc := range want {
			wantList = append(wantList, svc)
		}
		slices.SortStableFunc(wantList, fix.CompareServices)
		if !slices.Equal(got, wantList) {
			t.Fatalf("step %d: got %v, want %v", step, names(got), names(wantList))
		}
		lists = append(lists, handed{got, names(got)})
	}
	for i, h := range lists {
		if !slices.Equal(names(h.list), h.keys) {
			t.Fatalf("list %d was modified after it was handed out", i)
		}
	}
}
