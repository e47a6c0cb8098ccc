package deploy

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// What the predecessor (Kakao's network-node-manager, deploy/network-node-manager.yml of its last
// release) creates, rebuilt here from its names and rules: a ClusterRole that may get and patch
// services/status, bound to the ServiceAccount kube-system/network-node-manager — the name ours
// uses — and a DaemonSet of our DaemonSet's name with another (immutable) selector.
const (
	predecessorRole    = "network-node-manager-role"
	predecessorBinding = "network-node-manager-rolebinding"
	agentSA            = "network-node-manager"
	agentNS            = "kube-system"
)

func predecessorObjects() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.ServiceAccount, *appsv1.DaemonSet) {
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: predecessorRole}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
	}}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: predecessorBinding},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: predecessorRole},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: agentSA, Namespace: agentNS}}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: agentSA, Namespace: agentNS}}
	labels := map[string]string{"control-plane": "network-node-manager"}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "network-node-manager", Namespace: agentNS, Labels: labels},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				ServiceAccountName: agentSA, HostNetwork: true,
				Containers: []corev1.Container{{Name: "network-node-manager", Image: "kakaocorp/network-node-manager:latest",
					Command: []string{"/network-node-manager"}, Args: []string{"--metrics-addr=0"}}}}}}}
	return cr, crb, sa, ds
}

func createPredecessor(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	cr, crb, sa, ds := predecessorObjects()
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(agentNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().DaemonSets(agentNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// migrationSteps returns the commands of docs/deploy.md's migration block (between the markers), the
// one place the steps are written.
func migrationSteps(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- migration-steps -->\\s*```sh\\n(.*?)```").FindSubmatch(data)
	if m == nil {
		t.Fatal("docs/deploy.md: no ```sh block after <!-- migration-steps -->")
	}
	var steps []string
	for line := range strings.Lines(string(m[1])) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			steps = append(steps, line)
		}
	}
	return steps
}

// can asks the API server whether the agent's ServiceAccount may do verb on resource/subresource.
func can(ctx context.Context, t *testing.T, cs kubernetes.Interface, verb, resource, sub string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + agentNS + ":" + agentSA,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource, Subresource: sub}}}
	r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// agentBindings lists the (Cluster)RoleBindings that bind the agent's ServiceAccount.
func agentBindings(ctx context.Context, t *testing.T, cs kubernetes.Interface) []string {
	t.Helper()
	binds := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == agentSA && s.Namespace == agentNS
		})
	}
	var out []string
	crbs, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range crbs.Items {
		if binds(b.Subjects) {
			out = append(out, "ClusterRoleBinding "+b.Name+" -> ClusterRole "+b.RoleRef.Name)
		}
	}
	rbs, err := cs.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range rbs.Items {
		if binds(b.Subjects) {
			out = append(out, "RoleBinding "+b.Namespace+"/"+b.Name+" -> "+b.RoleRef.Kind+" "+b.RoleRef.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestMigrationFromPredecessor runs docs/deploy.md's migration steps against a real kube-apiserver on
// which the predecessor is installed: afterwards the agent's ServiceAccount still exists, may no
// longer get or patch services/status (which it inherited by name before the steps), and is bound
// exactly by deploy/base's bindings.
func TestMigrationFromPredecessor(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	cs := cp.AdminClient()
	a, err := agenttest.NewApplier(cp.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	createPredecessor(ctx, t, cs)
	if !can(ctx, t, cs, "patch", "services", "status") {
		t.Fatal("with the predecessor installed its ServiceAccount may not patch services/status: the setup is wrong")
	}

	// Our base cannot go on top: the DaemonSet has our name and an immutable selector.
	for _, o := range render(t, "base") {
		if o.u.GetKind() == "DaemonSet" {
			if err := a.Apply(ctx, o.u, true); err == nil {
				t.Error("applying our DaemonSet over the predecessor's succeeded; the docs say to delete it first")
			} else {
				t.Logf("our DaemonSet over the predecessor's: %v", err)
			}
		}
	}

	steps := migrationSteps(t)
	var (
		deleteDS   = regexp.MustCompile(`^kubectl -n (\S+) delete daemonset (\S+)$`)
		deleteCRB  = regexp.MustCompile(`^kubectl delete clusterrolebinding (\S+)$`)
		deleteCR   = regexp.MustCompile(`^kubectl delete clusterrole (\S+)$`)
		applyK     = regexp.MustCompile(`^kubectl apply -k (\S+)$`)
		rollout    = regexp.MustCompile(`^kubectl -n \S+ rollout status daemonset/\S+$`)
		getBinding = regexp.MustCompile(`^kubectl get clusterrolebindings,rolebindings -A -o wide$`)
	)
	for _, step := range steps {
		t.Logf("$ %s", step)
		var err error
		switch {
		case deleteDS.MatchString(step):
			m := deleteDS.FindStringSubmatch(step)
			err = cs.AppsV1().DaemonSets(m[1]).Delete(ctx, m[2], metav1.DeleteOptions{})
		case deleteCRB.MatchString(step):
			err = cs.RbacV1().ClusterRoleBindings().Delete(ctx, deleteCRB.FindStringSubmatch(step)[1], metav1.DeleteOptions{})
		case deleteCR.MatchString(step):
			err = cs.RbacV1().ClusterRoles().Delete(ctx, deleteCR.FindStringSubmatch(step)[1], metav1.DeleteOptions{})
		case applyK.MatchString(step):
			// deploy/… of the checkout, or an overlay the install steps write (my-cluster/install).
			k := applyK.FindStringSubmatch(step)[1]
			if rel, ok := strings.CutPrefix(k, "deploy/"); ok {
				k = rel
			} else {
				k = filepath.Join(docsOverlays(t), k)
			}
			for _, o := range render(t, k) {
				if err = a.Apply(ctx, o.u, false); err != nil {
					break
				}
			}
		case rollout.MatchString(step), getBinding.MatchString(step):
			t.Logf("  (no kubelet here: nothing to wait for; the bindings are listed below)")
		default:
			t.Fatalf("docs/deploy.md migration step %q: the test does not know this command; teach it or change the step", step)
		}
		if err != nil {
			t.Fatalf("step %q: %v", step, err)
		}
	}

	if _, err := cs.CoreV1().ServiceAccounts(agentNS).Get(ctx, agentSA, metav1.GetOptions{}); err != nil {
		t.Errorf("after the migration the ServiceAccount %s/%s: %v", agentNS, agentSA, err)
	}
	for _, verb := range []string{"patch", "get"} {
		if can(ctx, t, cs, verb, "services", "status") {
			t.Errorf("after the migration the agent's ServiceAccount may still %s services/status", verb)
		}
	}
	if !can(ctx, t, cs, "list", "services", "") || !can(ctx, t, cs, "watch", "nodes", "") {
		t.Error("after the migration the agent's ServiceAccount may not list Services or watch Nodes")
	}
	got := agentBindings(ctx, t, cs)
	want := []string{
		"ClusterRoleBinding network-node-manager -> ClusterRole network-node-manager",
		"ClusterRoleBinding network-node-manager-health -> ClusterRole network-node-manager-health",
		"RoleBinding default/network-node-manager-events -> Role network-node-manager-events",
		"RoleBinding kube-system/network-node-manager-kube-proxy-config -> Role network-node-manager-kube-proxy-config",
	}
	if !slices.Equal(got, want) {
		t.Errorf("bindings of %s/%s after the migration:\n  %s\nwant\n  %s", agentNS, agentSA, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, b := range got {
		t.Logf("RBAC after the migration: %s", b)
	}
}
