package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/network-node-manager/network-node-manager/internal/config"
)

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	body := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: " + server + "}\n" +
		"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// client-go's loading rules (#15 item 8): --kubeconfig / the kubeconfig key, then KUBECONFIG, then
// the in-cluster config. KUBECONFIG used to be ignored.
func TestKubeconfigLoadingRules(t *testing.T) {
	fromEnv := writeKubeconfig(t, "https://192.0.2.10:6443")
	explicit := writeKubeconfig(t, "https://192.0.2.20:6443")
	for _, c := range []struct {
		name string
		env  []string
		want string
	}{
		{"KUBECONFIG", []string{"KUBECONFIG=" + filepath.Join(t.TempDir(), "missing") + string(os.PathListSeparator) + fromEnv}, "https://192.0.2.10:6443"},
		{"the key beats KUBECONFIG", []string{"KUBECONFIG=" + fromEnv, "NNM_KUBECONFIG=" + explicit}, "https://192.0.2.20:6443"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.Load(nil, c.env, nil)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := RestConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if rc.Host != c.want {
				t.Errorf("API server %q, want %q", rc.Host, c.want)
			}
		})
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		cfg, err := config.Load(nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := RestConfig(cfg); err == nil {
			t.Error("no kubeconfig outside a cluster: want an error")
		}
	}
}

// One client per process (#21): every Get returns the same client, all of its requests go through
// one transport, and a wrap set after the client was made (Hub after RunProbes) sees
// them.
func TestAPIClientIsShared(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kube-proxy","namespace":"kube-system"}}`))
	}))
	defer srv.Close()
	cfg, err := config.Load(nil, []string{"NNM_KUBECONFIG=" + writeKubeconfig(t, srv.URL)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := NewAPIClient(cfg)
	a, err := api.Get()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := api.Get(); b != a {
		t.Fatal("a second Get made another client")
	}
	var wrapped atomic.Int32
	api.SetWrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) { wrapped.Add(1); return rt.RoundTrip(req) })
	})
	for range 2 {
		if _, err := a.GetConfigMap(context.Background(), "kube-system", "kube-proxy"); err != nil {
			t.Fatal(err)
		}
	}
	if requests.Load() != 2 || wrapped.Load() != 2 {
		t.Fatalf("%d requests reached the server, %d went through the wrap; want 2 and 2", requests.Load(), wrapped.Load())
	}

	none := NewAPIClient(&config.Config{Kubeconfig: filepath.Join(t.TempDir(), "missing")})
	if _, err := none.Get(); err == nil {
		t.Fatal("a missing kubeconfig: want an error")
	}
}
