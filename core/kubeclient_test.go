package core

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/config"
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
