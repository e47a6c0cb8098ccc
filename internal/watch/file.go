package watch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	k8swatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// File is a kube.Interface that serves the objects of a YAML file, read once, for offline use such
// as `plan`: the inputs list them through the same informers as from the API, and nothing ever
// changes. Documents are objects of the resources the inputs watch, or v1 Lists of them, separated
// by "---".
type File struct {
	objects map[string][]fileObject // by kind
	// NodeName is the name of the file's one Node ("" when it has none or several): `plan` reads
	// the Node of the file without a configured node name.
	NodeName string
}

type fileObject struct {
	obj runtime.Object
	// fields are the values a field selector may test (metadata.name, metadata.namespace,
	// spec.nodeName).
	fields fields.Set
}

// LoadFile parses path, whose objects must be of the kinds of resources. An object of another kind,
// or one that does not parse, is an error naming it.
func LoadFile(path string, resources []kube.Resource) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("services file: %w", err)
	}
	return ParseFile(path, data, resources)
}

// ParseFile parses data as LoadFile does; name is used in errors.
func ParseFile(name string, data []byte, resources []kube.Resource) (*File, error) {
	f := &File{objects: map[string][]fileObject{}}
	kinds := map[string]kube.Resource{}
	for _, r := range resources {
		kinds[r.Kind] = r
	}
	dec := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := dec.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 || isOnlyComments(doc) {
			continue
		}
		if err := f.add(name, i, doc, kinds); err != nil {
			return nil, err
		}
	}
	if nodes := f.objects["Node"]; len(nodes) == 1 {
		f.NodeName = nodes[0].fields["metadata.name"]
	}
	return f, nil
}

type typeMeta struct {
	Kind     string           `json:"kind"`
	Items    []map[string]any `json:"items"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
}

func (f *File) add(name string, i int, doc []byte, kinds map[string]kube.Resource) error {
	var tm typeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("%s: document %d: %w", name, i, err)
	}
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && kinds[strings.TrimSuffix(tm.Kind, "List")].Kind != "" {
		for j, item := range tm.Items {
			b, err := sigsyaml.Marshal(item)
			if err != nil {
				return err
			}
			if err := f.add(name, i*1000+j, b, kinds); err != nil {
				return err
			}
		}
		return nil
	}
	r, ok := kinds[tm.Kind]
	if !ok {
		known := make([]string, 0, len(kinds))
		for k := range kinds {
			known = append(known, k)
		}
		slices.Sort(known)
		return fmt.Errorf("%s: document %d: kind %q is not %s or List", name, i, tm.Kind, strings.Join(known, ", "))
	}
	obj := r.New()
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return fmt.Errorf("%s: document %d (%s): %w", name, i, tm.Kind, err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("%s: document %d (%s): %w", name, i, tm.Kind, err)
	}
	if r.Namespaced {
		// As kubectl does: a namespaced object must have a name; its namespace defaults to "default".
		if m.GetName() == "" {
			return fmt.Errorf("%s: document %d: %s without metadata.name", name, i, tm.Kind)
		}
		if m.GetNamespace() == "" {
			m.SetNamespace("default")
		}
	}
	f.objects[r.Kind] = append(f.objects[r.Kind], fileObject{obj: obj, fields: fields.Set{
		"metadata.name": m.GetName(), "metadata.namespace": m.GetNamespace(), "spec.nodeName": tm.Spec.NodeName}})
	return nil
}

func isOnlyComments(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

var errOffline = errors.New("offline: the objects come from a file")

// ListWatch lists the file's objects of r that fieldSelector selects; the watch never sends (and
// cannot stream a list: the reflector lists).
func (f *File) ListWatch(r kube.Resource, fieldSelector string) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			sel, err := fields.ParseSelector(fieldSelector)
			if err != nil {
				return nil, err
			}
			var objs []runtime.Object
			for _, o := range f.objects[r.Kind] {
				if sel.Matches(o.fields) {
					objs = append(objs, o.obj.DeepCopyObject())
				}
			}
			list := r.NewList()
			if err := meta.SetList(list, objs); err != nil {
				return nil, err
			}
			if lm, err := meta.ListAccessor(list); err == nil {
				lm.SetResourceVersion("1")
			}
			return list, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (k8swatch.Interface, error) {
			return k8swatch.NewFake(), nil
		},
	}, f)
}

// IsWatchListSemanticsUnSupported tells client-go's reflector to list (a file cannot stream).
func (f *File) IsWatchListSemanticsUnSupported() bool { return true }

// ServerResources serves no group: inputs that ask discovery take their configured fallback.
func (f *File) ServerResources(_ context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	gv, _ := schema.ParseGroupVersion(groupVersion)
	return nil, apierrors.NewNotFound(gv.WithResource("").GroupResource(), groupVersion)
}

// GetConfigMap finds nothing.
func (f *File) GetConfigMap(context.Context, string, string) (*corev1.ConfigMap, error) {
	return nil, errOffline
}

// CreateTokenReview fails: offline.
func (f *File) CreateTokenReview(context.Context, *authnv1.TokenReview) (*authnv1.TokenReview, error) {
	return nil, errOffline
}

// CreateSubjectAccessReview fails: offline.
func (f *File) CreateSubjectAccessReview(context.Context, *authzv1.SubjectAccessReview) (*authzv1.SubjectAccessReview, error) {
	return nil, errOffline
}

// CreateEvent fails: offline.
func (f *File) CreateEvent(context.Context, *eventsv1.Event) (*eventsv1.Event, error) {
	return nil, errOffline
}

// PatchEvent fails: offline.
func (f *File) PatchEvent(context.Context, string, string, types.PatchType, []byte) (*eventsv1.Event, error) {
	return nil, errOffline
}

// GetNode fails: offline.
func (f *File) GetNode(context.Context, string) (*corev1.Node, error) { return nil, errOffline }

// PatchNodeStatus fails: offline.
func (f *File) PatchNodeStatus(context.Context, string, types.PatchType, []byte) (*corev1.Node, error) {
	return nil, errOffline
}
