package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// NodeOverrides configures the engine for this node's labels before it starts, re-resolves when a
// relabel selects another entry (and not when the labels change without that), and when a reload
// changes the file; the metric follows; a deleted Node keeps the last entry.
func TestNodeOverridesFollowLabelsAndReloads(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	write := func(body string) *config.Config {
		t.Helper()
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(nil, []string{"NNM_CONFIG=" + file}, []string{"invalid-drop", "mss-clamp"})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	cfg := write("fixes:\n  mss-clamp: {enabled: false}\nnodeOverrides:\n- nodeSelector: {matchLabels: {pool: canary}}\n  fixes: {mss-clamp: {enabled: true}}\n")
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "canary"}}})
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := watch.NewHub(func() (kube.Interface, error) { return kubetest.From(cs), nil }, "n1", log)
	t.Cleanup(h.Stop)
	m := metrics.NewSync(prometheus.NewRegistry())

	var mu sync.Mutex
	var configured []*config.Config
	var reconfigured []*config.Config
	o := &NodeOverrides{node: node.New(), hub: h, m: m, log: log, base: cfg, applied: config.None,
		configure: func(c *config.Config) error {
			mu.Lock()
			defer mu.Unlock()
			configured = append(configured, c)
			return nil
		},
		reconfigure: func(c *config.Config) { mu.Lock(); defer mu.Unlock(); reconfigured = append(reconfigured, c) }}
	if err := o.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	enabled := func(c *config.Config) bool { on, _ := c.FixEnabled("mss-clamp"); return on }
	if len(configured) != 1 || !enabled(configured[0]) || configured[0].Override().Index != 0 {
		t.Fatalf("before the engine starts it must get the canary entry: %v", configured)
	}
	if v := testutil.ToFloat64(m.NodeOverride.WithLabelValues("0")); v != 1 {
		t.Errorf("nnm_config_node_override{override=0} = %v", v)
	}
	if !strings.Contains(logs.String(), "override 0 (pool=canary) applies on node n1") {
		t.Errorf("no log of the entry:\n%s", logs.String())
	}
	last := func() *config.Config {
		mu.Lock()
		defer mu.Unlock()
		if len(reconfigured) == 0 {
			return nil
		}
		return reconfigured[len(reconfigured)-1]
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(reconfigured) }
	relabel := func(labels map[string]string) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels = labels
		if _, err := cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel(map[string]string{"pool": "canary", "other": "x"})
	relabel(map[string]string{"pool": "general"})
	// The relabel reaches the engine.
	agenttest.Until(t, 10*time.Second, func() bool { c := last(); return c != nil && !enabled(c) })
	if n := count(); n != 1 {
		t.Errorf("%d reconfigurations; a label change that selects the same entry must not reconfigure", n)
	}
	if v := testutil.ToFloat64(m.NodeOverride.WithLabelValues("none")); v != 1 {
		t.Errorf("nnm_config_node_override{override=none} = %v", v)
	}
	// A reload whose entry selects pool=general: the engine gets it at once.
	o.Apply(write("fixes:\n  mss-clamp: {enabled: false}\nnodeOverrides:\n- nodeSelector: {matchLabels: {pool: general}}\n  fixes: {mss-clamp: {enabled: true}}\n"))
	if c := last(); !enabled(c) || c.Override().Selector != "pool=general" {
		t.Errorf("reload: %v", c.Override())
	}
	// The Node deleted (the informer hands nil): the last entry stays.
	n := count()
	o.nodeChanged(nil)
	if count() != n || last().Override().Selector != "pool=general" {
		t.Errorf("a deleted Node changed the configuration")
	}
}
