package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

const examples = "../../examples/"

// The graph that `run` builds is complete: every dependency of every constructor is provided.
func TestRunGraphValidates(t *testing.T) {
	err := fx.ValidateApp(fixes.Standard, agent.Agent, agent.Overrides, backends.Module,
		fx.Supply(agent.Inputs{Environ: []string{"NNM_PROXY_MODE=ipvs"}}),
		fx.Provide(agent.Hub),
		fx.Invoke(agent.WatchConfig),
	)
	if err != nil {
		t.Fatal(err)
	}
}

// Every metric the agent exports, core and fixes, passes promlint once a sync filled them in.
func TestMetricsPassPromlint(t *testing.T) {
	var reg *prometheus.Registry
	var e *engine.Engine
	fake := testkit.NewFakeBackend()
	app := fx.New(quiet(), fixes.Standard, agent.Module, backends.Module,
		fx.Supply(agent.Inputs{Environ: []string{"NNM_PROXY_MODE=ipvs", "NNM_FIXES_CONNTRACK_LIBERAL_ENABLED=false"}, Version: "test"}),
		fx.Provide(agent.FileHub(examples+"services.yaml")),
		fx.Decorate(func(backend.Backend) backend.Backend { return fake }),
		fx.Populate(&reg, &e),
	)
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Stop(context.Background())
	if failed := e.SyncOnce(context.Background(), true); failed {
		t.Fatal("sync against the fake backend failed")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, want := range []string{"nnm_syncs_total", "nnm_sync_duration_seconds", "nnm_rules_programmed",
		"nnm_last_successful_sync_timestamp_seconds", "nnm_fix_enabled", "nnm_agent_info",
		"nnm_ipvs_externalip_dnat_services", "nnm_fix_objects_skipped"} {
		if !names[want] {
			t.Errorf("metric %s missing after a sync", want)
		}
	}
	testkit.Promlint(t, reg)
}

func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand("test", fixes.Standard)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// `plan` on the example Services prints the DNAT and drop rules for both backends.
func TestPlanPrintsBothBackends(t *testing.T) {
	out, err := runCmd(t, "plan", "--services", examples+"services.yaml", "--config", examples+"config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# ---- backend iptables, fix invalid-drop, family ipv4",
		"-A NNM-INVALID-INPUT -m conntrack --ctstate INVALID",
		"-A NNM-EXTIP-DNAT -d 203.0.113.0/28 -j NNM-EXTIP-DNAT-CB007100",
		"-A NNM-EXTIP-DNAT-CB007100 -d 203.0.113.10/32 -p tcp -m tcp --dport 80 -m connlabel --label ",
		"--set -j DNAT --to-destination 10.96.0.10:80",
		"-A NNM-EXTIP-POSTROUTING -m connlabel --label ",
		"-j DNAT --to-destination [fd00:10:96::a]:443",
		"# ---- backend nftables, fix ipvs-externalip-dnat, family ipv6",
		"add element ip nnm-ipvs-externalip-dnat svc { 203.0.113.53 . udp . 53",
		"ct state invalid counter name",
		"# skipped default/proxied: ipmode-proxy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q", want)
		}
	}
	if strings.Contains(out, "203.0.113.30") && !strings.Contains(out, "skipped default/proxied") {
		t.Error("the ipMode Proxy address must only appear as skipped")
	}
	if t.Failed() {
		t.Log(out)
	}
}

func TestPlanOneBackendAndErrors(t *testing.T) {
	out, err := runCmd(t, "plan", "--services", examples+"services.yaml", "--backend", "nftables", "--proxy-mode", "ipvs")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "backend iptables") || !strings.Contains(out, "backend nftables") {
		t.Fatalf("--backend nftables must print only nftables:\n%s", out)
	}
	// A node-state fix (fix.Actuator) is listed as such and has no rules to print.
	out, err = runCmd(t, "plan", "--services", examples+"services.yaml", "--backend", "nftables", "--set", "fixes.conntrack-liberal.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "# fix conntrack-liberal: enabled; it changes node state, not rules") || strings.Contains(out, "fix conntrack-liberal, family") {
		t.Fatalf("plan must list conntrack-liberal as a node-state fix without rules:\n%s", out)
	}
	if _, err := runCmd(t, "plan"); err == nil || !strings.Contains(err.Error(), "--services") {
		t.Fatalf("plan without --services: %v", err)
	}
	if _, err := runCmd(t, "plan", "--services", examples+"services.yaml", "--set", "fixes.invalid-drop.hookz=input"); err == nil ||
		!strings.Contains(err.Error(), "hookz") || strings.Contains(err.Error(), "reflect") {
		t.Fatalf("want a short error naming the unknown key, got %v", err)
	}
}

func TestVersionListsFixes(t *testing.T) {
	out, err := runCmd(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"invalid-drop", "ipvs-externalip-dnat", "conntrack-liberal"} {
		if !strings.Contains(out, id) {
			t.Errorf("version does not list %s:\n%s", id, out)
		}
	}
}

// In the graph of `run` the engine and the fixes hold an engine.Live, so that the agent can switch
// backends while it runs when kube-proxy's mode moves it (agent.Follow); the backend it starts with
// is the one detection chose.
func TestRunGraphBackendIsLive(t *testing.T) {
	var be backend.Backend
	app := fx.New(quiet(), fixes.Standard, agent.Agent, backends.Module, backends.Takeover,
		fx.Supply(agent.Inputs{Environ: []string{"NNM_PROXY_MODE=ipvs", "NNM_BACKEND=nftables", "NNM_IPTABLES_VARIANT=nft",
			"NNM_LOG_LEVEL=error", "KUBECONFIG=/nonexistent"}}),
		fx.Provide(agent.Hub),
		fx.Populate(&be),
	)
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	live, ok := be.(*engine.Live)
	if !ok {
		t.Fatalf("the run graph's backend is %T, want *engine.Live", be)
	}
	if live.Current().Name() != "nftables" {
		t.Fatalf("Live holds %s, want the configured nftables", live.Current().Name())
	}
}
