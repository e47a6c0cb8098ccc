package testkit

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// Source is an inputs.Source for an input's unit tests, without an API server: an informer it
// runs holds the objects of its resource (Add, Update, Delete, or the objects given to NewSource)
// that its field selector selects (metadata.name, metadata.namespace, spec.nodeName), runs the
// input's transform and handler on each at once, and is synced from the start. Discovery (Go)
// serves the resources in Served. An input's real informers
// are the runtime's; prove them against a real kube-apiserver in the repository's own tests.
type Source struct {
	// Served is what discovery says the API serves.
	Served []inputs.Resource

	t        testing.TB
	nodeName string
	log      *slog.Logger

	mu        sync.Mutex
	objects   []runtime.Object
	informers []*fakeInformer
	changes   int
	wg        sync.WaitGroup
	ctx       context.Context
}

type fakeInformer struct {
	r         inputs.Resource
	selector  fields.Selector
	transform cache.TransformFunc
	handler   cache.ResourceEventHandler
	store     cache.Store
}

var _ inputs.Source = (*Source)(nil)

// NewSource returns a Source of this node nodeName ("" for none) holding objects; what it started
// ends with the test.
func NewSource(t testing.TB, nodeName string, objects ...runtime.Object) *Source {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Source{t: t, nodeName: nodeName, log: slog.New(slog.DiscardHandler), objects: objects, ctx: ctx}
	t.Cleanup(func() { cancel(); s.wg.Wait() })
	return s
}

// NodeName is the node name given to NewSource.
func (s *Source) NodeName() string { return s.nodeName }

// Log discards.
func (s *Source) Log() *slog.Logger { return s.log }

// Changed counts the input's change signals (Changes).
func (s *Source) Changed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changes++
}

// Changes is how many times an input signalled a change.
func (s *Source) Changes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes
}

// ReportAPIError fails the test: a Source has no API that could fail.
func (s *Source) ReportAPIError(key, msg string, args ...any) {
	s.t.Errorf("API error reported under %s: %s %v", key, msg, args)
}

// TransportLogs is false.
func (s *Source) TransportLogs() bool { return false }

// Go runs f in the background until the test ends, with a discovery of the resources asked for.
func (s *Source) Go(f func(ctx context.Context, api inputs.Discovery)) error {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f(s.ctx, s)
	}()
	return nil
}

// ServerResources lists the resources of Served in groupVersion.
func (s *Source) ServerResources(_ context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := &metav1.APIResourceList{GroupVersion: groupVersion}
	for _, r := range s.Served {
		if r.GroupVersion.String() == groupVersion {
			list.APIResources = append(list.APIResources, metav1.APIResource{Name: r.Name, Kind: r.Kind, Namespaced: r.Namespaced})
		}
	}
	return list, nil
}

// Informer holds the objects of r that fieldSelector selects; handler has seen them all when it
// returns.
func (s *Source) Informer(r inputs.Resource, fieldSelector string, transform cache.TransformFunc,
	handler cache.ResourceEventHandler) (cache.Store, cache.InformerSynced, error) {
	sel, err := fields.ParseSelector(fieldSelector)
	if err != nil {
		return nil, nil, err
	}
	inf := &fakeInformer{r: r, selector: sel, transform: transform, handler: handler,
		store: cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)}
	s.mu.Lock()
	s.informers = append(s.informers, inf)
	objects := append([]runtime.Object(nil), s.objects...)
	s.mu.Unlock()
	for _, o := range objects {
		inf.event(s.t, o, false)
	}
	return inf.store, func() bool { return true }, nil
}

// Add adds obj, as the API server would announce a new object.
func (s *Source) Add(obj runtime.Object) { s.apply(obj, false) }

// Update replaces obj (same namespace and name).
func (s *Source) Update(obj runtime.Object) { s.apply(obj, false) }

// Delete removes obj.
func (s *Source) Delete(obj runtime.Object) { s.apply(obj, true) }

func (s *Source) apply(obj runtime.Object, deleted bool) {
	s.mu.Lock()
	s.objects = append(s.objects, obj)
	infs := append([]*fakeInformer(nil), s.informers...)
	s.mu.Unlock()
	for _, inf := range infs {
		inf.event(s.t, obj, deleted)
	}
}

func (inf *fakeInformer) event(t testing.TB, obj runtime.Object, deleted bool) {
	if reflect.TypeOf(obj) != reflect.TypeOf(inf.r.New()) || !inf.selector.Matches(objectFields(obj)) {
		return
	}
	var o any = obj.DeepCopyObject()
	if inf.transform != nil {
		var err error
		if o, err = inf.transform(o); err != nil {
			t.Fatalf("transform of %s: %v", inf.r, err)
		}
	}
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o)
	if err != nil {
		t.Fatalf("key of a %s: %v", inf.r, err)
	}
	old, exists, _ := inf.store.GetByKey(key)
	switch {
	case deleted:
		if exists {
			_ = inf.store.Delete(old)
			inf.handler.OnDelete(o)
		}
	case exists:
		_ = inf.store.Update(o)
		inf.handler.OnUpdate(old, o)
	default:
		_ = inf.store.Add(o)
		inf.handler.OnAdd(o, true)
	}
}

// objectFields are the fields a field selector of an input may test.
func objectFields(obj runtime.Object) fields.Set {
	set := fields.Set{}
	if m, err := meta.Accessor(obj); err == nil {
		set["metadata.name"], set["metadata.namespace"] = m.GetName(), m.GetNamespace()
	}
	if v := reflect.ValueOf(obj).Elem().FieldByName("Spec"); v.IsValid() {
		if n := v.FieldByName("NodeName"); n.IsValid() && n.Kind() == reflect.String {
			set["spec.nodeName"] = n.String()
		}
	}
	return set
}
