package agenttest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// ReadManifests decodes the ServiceAccounts, roles and role bindings in the files; other kinds
// (ConfigMap, DaemonSet) are not needed to give the agent under test its identity and are skipped.
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

// ApplyManifests creates (or updates) the objects of the files. mutate, if set, may change each object
// before it is applied (rename it, drop a rule).
func ApplyManifests(ctx context.Context, cs kubernetes.Interface, files []string, mutate func(obj any)) error {
	objs, err := ReadManifests(files)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if mutate != nil {
			mutate(obj)
		}
		if err := applyObject(ctx, cs, obj); err != nil {
			return err
		}
	}
	return nil
}

func applyObject(ctx context.Context, cs kubernetes.Interface, obj any) error {
	var err error
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		if err = EnsureNamespace(ctx, cs, o.Namespace); err != nil {
			return err
		}
		_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case *rbacv1.ClusterRole:
		_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.ClusterRoleBinding:
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.Role:
		if err = EnsureNamespace(ctx, cs, o.Namespace); err != nil {
			return err
		}
		_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().Roles(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.RoleBinding:
		if err = EnsureNamespace(ctx, cs, o.Namespace); err != nil {
			return err
		}
		_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	default:
		return fmt.Errorf("cannot apply %T", obj)
	}
	if err != nil {
		return fmt.Errorf("apply %T: %w", obj, err)
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
