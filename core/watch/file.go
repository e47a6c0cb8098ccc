package watch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// File is a Source that reads Services (and optionally a Node and Pods) from a YAML file once, for
// offline use such as `plan`. Documents may be Services, Nodes, Pods, or v1 Lists of them, separated
// by "---".
type File struct {
	services []*fix.Service
	node     *corev1.Node
	pods     []*corev1.Pod
	changes  chan struct{}
}

// LoadFile parses path. An object of another kind, or one that does not parse, is an error naming it.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("services file: %w", err)
	}
	return ParseFile(path, data)
}

// ParseFile parses data as LoadFile does; name is used in errors.
func ParseFile(name string, data []byte) (*File, error) {
	f := &File{changes: make(chan struct{})}
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
		if err := f.add(name, i, doc); err != nil {
			return nil, err
		}
	}
	SortServices(f.services)
	SortPods(f.pods)
	return f, nil
}

type typeMeta struct {
	Kind  string           `json:"kind"`
	Items []map[string]any `json:"items"`
}

func (f *File) add(name string, i int, doc []byte) error {
	var tm typeMeta
	if err := sigsyaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("%s: document %d: %w", name, i, err)
	}
	switch tm.Kind {
	case "Service":
		svc, err := decode[corev1.Service](name, i, tm.Kind, doc, true)
		if err != nil {
			return err
		}
		f.services = append(f.services, fix.ServiceFrom(svc))
	case "Node":
		n, err := decode[corev1.Node](name, i, tm.Kind, doc, false)
		if err != nil {
			return err
		}
		f.node = StripNode(n)
	case "Pod":
		p, err := decode[corev1.Pod](name, i, tm.Kind, doc, true)
		if err != nil {
			return err
		}
		f.pods = append(f.pods, StripPod(p))
	case "List", "ServiceList", "NodeList", "PodList":
		for j, item := range tm.Items {
			b, err := sigsyaml.Marshal(item)
			if err != nil {
				return err
			}
			if err := f.add(name, i*1000+j, b); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: document %d: kind %q is not Service, Node, Pod or List", name, i, tm.Kind)
	}
	return nil
}

// decode reads document i of the file called name strictly as an object of kind. A namespaced one
// (Service, Pod) must have a name; its namespace defaults to "default", as kubectl's does.
func decode[T any, P interface {
	*T
	metav1.Object
}](name string, i int, kind string, doc []byte, namespaced bool) (P, error) {
	obj := P(new(T))
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: document %d (%s): %w", name, i, kind, err)
	}
	if namespaced {
		if obj.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d: %s without metadata.name", name, i, kind)
		}
		if obj.GetNamespace() == "" {
			obj.SetNamespace("default")
		}
	}
	return obj, nil
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

// Start does nothing: the file was read by LoadFile.
func (f *File) Start(context.Context, fix.Needs) error { return nil }

// WaitForSync returns at once.
func (f *File) WaitForSync(context.Context) error { return nil }

// Services returns the file's Services.
func (f *File) Services() []*fix.Service { return f.services }

// Node returns the file's Node, if it had one.
func (f *File) Node() *corev1.Node { return f.node }

// Pods returns the file's Pods.
func (f *File) Pods() []*corev1.Pod { return f.pods }

// Changes never fires.
func (f *File) Changes() <-chan struct{} { return f.changes }

// Stop does nothing.
func (f *File) Stop() {}
