package agenttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	memory "k8s.io/client-go/discovery/cached"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// DeployBaseFiles are the files deploy/base/kustomization.yaml lists: the agent's identity (its
// ServiceAccount, roles and bindings) as deployed.
func DeployBaseFiles() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, "deploy", "base")
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("deploy/base/kustomization.yaml: %w", err)
	}
	var files []string
	for _, r := range k.Resources {
		files = append(files, filepath.Join(dir, r))
	}
	return files, nil
}

// ReadManifests decodes the ServiceAccounts, roles and role bindings in the files strictly; other
// kinds (ConfigMap, DaemonSet) are not needed to give the agent under test its identity and are
// skipped.
func ReadManifests(files []string) ([]any, error) {
	var objs []any
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitYAML(data) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", f, i, err)
			}
			var obj any
			switch tm.Kind {
			case "ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "ClusterRole":
				obj = &rbacv1.ClusterRole{}
			case "ClusterRoleBinding":
				obj = &rbacv1.ClusterRoleBinding{}
			case "Role":
				obj = &rbacv1.Role{}
			case "RoleBinding":
				obj = &rbacv1.RoleBinding{}
			default:
				continue
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				return nil, fmt.Errorf("%s document %d (%s): %w", f, i, tm.Kind, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs, nil
}

func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// ApplyManifests server-side applies the objects of the files (ReadManifests), each namespace they
// live in first. mutate, if set, may change each object before it is applied (rename it, drop a rule).
func ApplyManifests(ctx context.Context, cfg *rest.Config, files []string, mutate func(obj any)) error {
	objs, err := ReadManifests(files)
	if err != nil {
		return err
	}
	a, err := NewApplier(cfg)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if mutate != nil {
			mutate(obj)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return fmt.Errorf("%T: %w", obj, err)
		}
		u := &unstructured.Unstructured{Object: m}
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		if ns := u.GetNamespace(); ns != "" {
			nsObj := &unstructured.Unstructured{}
			nsObj.SetAPIVersion("v1")
			nsObj.SetKind("Namespace")
			nsObj.SetName(ns)
			if err := a.Apply(ctx, nsObj, false); err != nil {
				return err
			}
		}
		if err := a.Apply(ctx, u, false); err != nil {
			return err
		}
	}
	return nil
}

// Applier applies objects of any kind the API server serves, as `kubectl apply --server-side`
// does: the one way tests, the demo and the manifest checks put manifests into a cluster.
type Applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

// NewApplier returns an Applier for the cluster of cfg; kinds are resolved by discovery.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// ErrKindNotServed is wrapped by Apply when the API server does not serve the object's kind (a CRD
// that is not installed).
var ErrKindNotServed = errors.New("kind not served")

// Apply server-side applies u (field manager "kubectl", forced). With dryRun the server validates
// and admits it without storing it.
func (a *Applier) Apply(ctx context.Context, u *unstructured.Unstructured, dryRun bool) error {
	gvk := u.GroupVersionKind()
	what := fmt.Sprintf("%s %s/%s", gvk.Kind, u.GetNamespace(), u.GetName())
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("%s: %w", gvk, ErrKindNotServed)
	}
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return fmt.Errorf("%s: namespaced object without namespace", what)
		}
		ri = a.dyn.Resource(mapping.Resource).Namespace(u.GetNamespace())
	} else if u.GetNamespace() != "" {
		return fmt.Errorf("%s: cluster-scoped object with a namespace", what)
	}
	opts := metav1.ApplyOptions{FieldManager: "kubectl", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Apply(ctx, u.GetName(), u, opts); err != nil {
		return fmt.Errorf("apply %s: %w", what, err)
	}
	return nil
}

// EnsureNamespace creates the namespace unless it exists.
func EnsureNamespace(ctx context.Context, cs kubernetes.Interface, name string) error {
	if name == "" {
		return nil
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
