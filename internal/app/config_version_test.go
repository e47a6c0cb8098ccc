package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

// An old agent started on a ConfigMap written for a newer version (a key, a fix and a fix option it
// does not know) starts with the agent's real graph (run's fixes, core, backends), takes the keys it
// knows (invalid-drop enabled) and syncs. The same file declaring this agent's version stops
// start-up, as a typo must.
func TestAgentStartsOnANewerConfig(t *testing.T) {
	body := `configVersion: %d
syncPeriod: 10s
shinyNewKey: true
fixes:
  brand-new-fix: {enabled: true}
  conntrack-liberal: {enabled: false}
  invalid-drop:
    enabled: true
    newOption: 7
`
	start := func(version int) (*fx.App, *engine.Engine, *prometheus.Registry) {
		p := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(p, []byte(fmt.Sprintf(body, version)), 0o600); err != nil {
			t.Fatal(err)
		}
		var reg *prometheus.Registry
		var e *engine.Engine
		app := fx.New(quiet(), fixes.Standard, agent.Module, backends.Module,
			fx.Supply(agent.Inputs{Environ: []string{"NNM_PROXY_MODE=ipvs", "NNM_CONFIG=" + p}, Version: "test"}),
			fx.Provide(agent.FileHub(examples+"services.yaml")),
			fx.Decorate(func(backend.Backend) backend.Backend { return testkit.NewFakeBackend() }),
			fx.Populate(&reg, &e),
		)
		return app, e, reg
	}

	app, _, _ := start(config.Version)
	if err := app.Err(); err == nil || !strings.Contains(err.Error(), "config: shinyNewKey (line 3): unknown key") {
		t.Fatalf("at this agent's version an unknown key must stop start-up, got %v", err)
	}

	app, e, reg := start(config.Version + 1)
	if err := app.Err(); err != nil {
		t.Fatalf("the agent must start on a newer config: %v", err)
	}
	// SyncOnce starts the file's informers; only Stop ends them.
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	if failed := e.SyncOnce(context.Background(), true); failed {
		t.Fatal("sync failed")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	enabled := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "nnm_fix_enabled" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "fix" {
					enabled[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	if enabled["invalid-drop"] != 1 {
		t.Errorf("nnm_fix_enabled %v: invalid-drop from the newer file must run", enabled)
	}
	if _, ok := enabled["brand-new-fix"]; ok {
		t.Errorf("nnm_fix_enabled %v names the ignored fix", enabled)
	}
}
