package e2e

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// scenarioLeastPrivilege proves that deploy/base grants what the agent needs and little more:
//   - the agent's ServiceAccount can list Services but not Pods, Secrets or ConfigMaps;
//   - for every rule of the manifest's ClusterRole, an agent whose role lacks just that rule does not
//     become ready (and logs "forbidden"), and becomes ready as soon as the rule is granted again.
//
// The namespaced Role (get the kube-system/kube-proxy ConfigMap) serves only kube-proxy mode detection
// with proxyMode auto; the scenarios set --proxy-mode ipvs, so it is applied but not proven needed here.
func scenarioLeastPrivilege(t *testing.T, c *cluster, backend string) {
	t.Run("no-more-than-needed", func(t *testing.T) {
		kc, err := c.cp.ServiceAccountKubeconfig(t.Context(), saNamespace, saName, "")
		if err != nil {
			t.Fatal(err)
		}
		cs := clientFor(t, kc)
		if _, err := cs.CoreV1().Services("").List(t.Context(), metav1.ListOptions{Limit: 1}); err != nil {
			t.Errorf("the agent's ServiceAccount cannot list Services: %v", err)
		}
		for what, list := range map[string]func() error{
			"delete pods": func() error { return cs.CoreV1().Pods("default").Delete(t.Context(), "any", metav1.DeleteOptions{}) },
			// Pods access comes only with deploy/components/stale-udp-conntrack.
			"list pods":  func() error { _, err := cs.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{}); return err },
			"secrets":    func() error { _, err := cs.CoreV1().Secrets("").List(t.Context(), metav1.ListOptions{}); return err },
			"configmaps": func() error { _, err := cs.CoreV1().ConfigMaps("").List(t.Context(), metav1.ListOptions{}); return err },
			"update services": func() error {
				_, err := cs.CoreV1().Services("default").Update(t.Context(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}}, metav1.UpdateOptions{})
				return err
			},
		} {
			if err := list(); !apierrors.IsForbidden(err) {
				t.Errorf("%s as the agent's ServiceAccount: got %v, want Forbidden", what, err)
			}
		}
	})

	role := manifestRole(t)
	for i, rule := range role.Rules {
		what := strings.Join(rule.Resources, ",")
		if slices.Contains(rule.Verbs, "create") {
			// The TokenReview/SubjectAccessReview rules serve authenticated /metrics scrapes, not
			// syncing: deploy's TestManifestsAgainstAPIServer proves them (401/403/200 per scrape).
			continue
		}
		t.Run("without-"+what, func(t *testing.T) {
			t.Parallel()
			name := fmt.Sprintf("nnm-e2e-%s-no-%s", backend, strings.Join(rule.Resources, "-"))
			grant := func(withRule bool) {
				t.Helper()
				// Every object is renamed (prefix name), so this agent's identity is its own.
				rename := func(orig string) string { return name + "." + orig }
				err := agenttest.ApplyManifests(t.Context(), c.cp.AdminRESTConfig(), manifestFiles(t), func(obj any) {
					switch o := obj.(type) {
					case *corev1.ServiceAccount:
						o.Name = name
					case *rbacv1.ClusterRole:
						if !withRule && o.Name == role.Name {
							o.Rules = append(o.Rules[:i:i], o.Rules[i+1:]...)
						}
						o.Name = rename(o.Name)
					case *rbacv1.Role:
						o.Name = rename(o.Name)
					case *rbacv1.ClusterRoleBinding:
						o.Name, o.RoleRef.Name = rename(o.Name), rename(o.RoleRef.Name)
						for j := range o.Subjects {
							o.Subjects[j].Name = name
						}
					case *rbacv1.RoleBinding:
						o.Name, o.RoleRef.Name = rename(o.Name), rename(o.RoleRef.Name)
						for j := range o.Subjects {
							o.Subjects[j].Name = name
						}
					}
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			grant(false)
			// Pods are read only by stale-udp-conntrack, which is off by default: enable it so that
			// the rule is needed.
			var args []string
			if slices.Contains(rule.Resources, "pods") {
				args = []string{"--enable-fix", "stale-udp-conntrack"}
			}
			n := startNode(t, c, backend, nodeOptions{sa: name, noWait: true, args: args})
			agenttest.Eventually(t, readyTimeout, func() error {
				if err := n.agent.Exited(); err != nil {
					return agenttest.Permanent(fmt.Errorf("agent exited: %w", err))
				}
				if !strings.Contains(n.agent.Logs(), "forbidden") {
					return errors.New("the agent has not logged a forbidden request yet")
				}
				return nil
			})
			agenttest.Consistently(t, 2*time.Second, func() error {
				if err := n.agent.Probe(t.Context(), "/readyz"); err == nil {
					return fmt.Errorf("the agent is ready without %v on %v", rule.Verbs, rule.Resources)
				}
				return nil
			})
			t.Logf("without the rule for %s: not ready, as expected", what)
			grant(true)
			n.waitReady()
			n.checkSyncHealthy()
		})
	}
}

func manifestRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	objs, err := agenttest.ReadManifests(manifestFiles(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if r, ok := obj.(*rbacv1.ClusterRole); ok && len(r.Rules) > 0 {
			return r
		}
	}
	t.Fatal("deploy/base/rbac.yaml holds no ClusterRole with rules")
	return nil
}

func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
