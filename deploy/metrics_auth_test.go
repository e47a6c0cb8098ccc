package deploy

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/server"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/servertest"
)

// agentClient is a client with the identity of the agent's ServiceAccount (as deploy/base creates it).
// agentConfig is a client configuration as the agent's ServiceAccount.
func agentConfig(t *testing.T, cp *controlplane.ControlPlane) *rest.Config {
	t.Helper()
	kc, err := cp.ServiceAccountKubeconfig(t.Context(), "kube-system", "network-node-manager", "")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// agentClient is a clientset as the agent's ServiceAccount (for checking its access).
func agentClient(t *testing.T, cp *controlplane.ControlPlane) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(agentConfig(t, cp))
}

// checkProtectedMetrics runs the agent's metrics server as deploy/base configures it (HTTPS, delegated
// authentication and authorization through the agent's ServiceAccount and its RBAC from deploy/base)
// against the real API server, and scrapes it the way components/podmonitor does: no token 401, a bad
// token 401, a token without the metrics reader role 403, the scraper's token 200. The plain probes
// need no token.
func checkProtectedMetrics(t *testing.T, cp *controlplane.ControlPlane, a *agenttest.Applier) {
	ctx := t.Context()
	for _, o := range render(t, "overlays/podmonitor") {
		if o.u.GetKind() == "PodMonitor" {
			continue // no CRD here; the scraper identity around it is applied for real
		}
		if err := a.Apply(ctx, o.u, false); err != nil {
			t.Fatalf("apply %s: %v", o, err)
		}
	}
	kc, err := kube.New(agentConfig(t, cp)) // the agent's own client
	if err != nil {
		t.Fatal(err)
	}
	s := servertest.StartDelegated(t, kc, "nnm_auth_test", server.Options{HealthzAddress: "127.0.0.1:0"})

	token := func(ns, name string) string {
		admin := cp.AdminClient()
		_, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // self-signed, as the PodMonitor
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	metrics := "https://" + s.Addr() + "/metrics"
	for _, c := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token the API server does not know", "not-a-token", http.StatusUnauthorized},
		{"a ServiceAccount without the metrics reader role", token("default", "stranger"), http.StatusForbidden},
		{"the PodMonitor's scraper", token("kube-system", "network-node-manager-metrics-scraper"), http.StatusOK},
	} {
		code, body, err := netns.Get(ctx, client, metrics, c.token)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("GET /metrics as %s: %d %s", c.who, code, strings.TrimSpace(strings.SplitN(body, "\n", 2)[0]))
		if code != c.want {
			t.Errorf("GET /metrics as %s: %d, want %d: %s", c.who, code, c.want, body)
		}
		if code == http.StatusOK && !strings.Contains(body, "nnm_auth_test 1") {
			t.Errorf("scraper got no metrics: %q", body)
		}
	}
	// Plain HTTP to the HTTPS port is refused; the probes are plain and open.
	if resp, err := http.Get("http://" + s.Addr() + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the metrics port: %d, want 400", resp.StatusCode)
		}
	}
	resp, err := http.Get("http://" + s.HealthzAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("plain /healthz without a token: %d", resp.StatusCode)
	}
}
