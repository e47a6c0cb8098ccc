package server_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// scraperToken makes the scraper, a ServiceAccount allowed to get /metrics as
// deploy/components/podmonitor sets up, and returns a token of it.
func scraperToken(t *testing.T, cp *controlplane.ControlPlane) string {
	t.Helper()
	ctx := t.Context()
	admin := cp.AdminClient()
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scraper"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flood-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flood-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "flood-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "default", Name: "scraper"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return newScraperToken(t, admin)
}

// newScraperToken returns a new token of the scraper (one the agent has not cached).
func newScraperToken(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(t.Context(), "scraper", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// agentClient is the agent's API client on cp (agent.RestConfig: QPS and burst as in production),
// counting its TokenReviews in reviews.
func agentClient(t *testing.T, cp *controlplane.ControlPlane, reviews *atomic.Int64) kube.Interface {
	t.Helper()
	rc, err := agent.RestConfig(&config.Config{Kubeconfig: cp.AdminKubeconfig()})
	if err != nil {
		t.Fatal(err)
	}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countReviews{rt, reviews} })
	client, err := kube.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
