package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// The alerts (components/prometheusrule) and the dashboard (components/grafana-dashboard) are checked
// here: promtool (bin/promtool, from Debian's prometheus package by `make promtool`) checks the rules and runs their unit
// tests, and every metric name in a rule or a dashboard query must be one the agent registers.

const (
	rulesDir      = "components/prometheusrule"
	dashboardFile = "components/grafana-dashboard/network-node-manager.json"
)

func promtool(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(controlplane.BinDirEnv)
	if dir == "" {
		dir, _ = filepath.Abs("../bin")
	}
	p := filepath.Join(dir, "promtool")
	if _, err := os.Stat(p); err != nil {
		netns.Unavailable(t, "%s missing: run `make promtool` (hack/fetch-promtool.sh)", p)
	}
	return p
}

// ruleGroups is the PrometheusRule's spec: the same structure as a Prometheus rule file.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	o := find(t, render(t, "overlays/monitoring"), "PrometheusRule", "network-node-manager")
	if o.u.GetAPIVersion() != "monitoring.coreos.com/v1" || o.u.GetNamespace() != "kube-system" {
		t.Errorf("PrometheusRule %s in %q", o.u.GetAPIVersion(), o.u.GetNamespace())
	}
	spec, err := json.Marshal(o.u.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var rg ruleGroups
	if err := yaml.UnmarshalStrict(spec, &rg); err != nil {
		t.Fatalf("PrometheusRule spec: %v", err)
	}
	return rg
}

// The alerts the issue asks for, each with a unit test that fires it and one that does not.
func TestPrometheusRules(t *testing.T) {
	rg := loadRules(t)
	var alerts []string
	for _, g := range rg.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s needs a severity label, a summary and a description", r.Alert)
			}
		}
	}
	for _, want := range []string{"NetworkNodeManagerSyncFailing", "NetworkNodeManagerSyncStale", "NetworkNodeManagerRepairsRising",
		"NetworkNodeManagerObjectsSkipped", "NetworkNodeManagerFixRefused", "NetworkNodeManagerNotReady", "NetworkNodeManagerAgentMissing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alert %s missing (have %v)", want, alerts)
		}
	}

	// Every alert is tested both ways.
	data, err := os.ReadFile(filepath.Join(rulesDir, "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, a := range alerts {
		if !fires[a] || !quiet[a] {
			t.Errorf("alert %s: rules_test.yaml must have a case that fires it (%v) and one that does not (%v)", a, fires[a], quiet[a])
		}
	}

	bin := promtool(t)
	dir := t.TempDir()
	rulesYAML, err := yaml.Marshal(rg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tests.RuleFiles, []string{"rules.yaml"}) {
		t.Fatalf("rules_test.yaml rule_files = %v, want [rules.yaml] (the extracted spec)", tests.RuleFiles)
	}
	for name, content := range map[string][]byte{"rules.yaml": rulesYAML, "rules_test.yaml": data} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// registeredMetrics returns what the agent's registry describes (core, every standard fix, Go and
// process collectors), name → variable labels, built as `run` builds it.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	var reg *prometheus.Registry
	var e *engine.Engine // fx constructs only what is asked for: the engine pulls in every fix and metric
	app := fx.New(fx.NopLogger, fixes.Standard, agent.Module,
		fx.Supply(agent.Inputs{Environ: []string{"NNM_PROXY_MODE=ipvs", "NNM_FIXES_CONNTRACK_LIBERAL_ENABLED=false"}, Version: "test"}),
		fx.Provide(agent.FileHub("../examples/services.yaml")),
		fx.Provide(func() backend.Backend { return testkit.NewFakeBackend() }),
		fx.Populate(&reg, &e),
	)
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	// Desc has no accessors; its String() is "Desc{fqName: "…", help: "…", constLabels: {…}, variableLabels: {a,b}}".
	re := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		m := re.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		var labels []string
		for l := range strings.SplitSeq(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		out[m[1]] = labels
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics described: %v", len(out), out)
	}
	return out
}

// metricNames returns the metric names a PromQL expression selects. It drops what is not a metric:
// strings, label matchers, ranges, grouping clauses, function and aggregation names, keywords.
func metricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'|` + "`[^`]*`"),
		regexp.MustCompile(`\{[^}]*\}`),
		regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
		regexp.MustCompile(`\b[a-zA-Z_]\w*\s*\(`),
		regexp.MustCompile(`\b(and|or|unless|bool|offset|inf|nan|Inf|NaN)\b`),
	} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, m := range regexp.MustCompile(`(^|[^\w.$])([a-zA-Z_:][\w:]*)`).FindAllStringSubmatch(expr, -1) {
		names = append(names, m[2])
	}
	return names
}

func TestMetricNamesExtracted(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (fix, le) (rate(nnm_sync_duration_seconds_bucket{node=~"$node", fix="a"}[$__rate_interval])))
		/ on (pod) group_left(node) up == bool 1 and time() - nnm_x offset 5m > 1e3`)
	if want := []string{"nnm_sync_duration_seconds_bucket", "up", "nnm_x"}; !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}

// Every metric a rule or the dashboard queries is registered by the agent, and the dashboard shows
// every per-fix core metric (those with a fix label). A metric renamed in the code (e.g. a fix's
// metrics following its id) fails here until the rules and the dashboard follow.
func TestMonitoringUsesRegisteredMetrics(t *testing.T) {
	registered := registeredMetrics(t)
	// Not the agent's: Prometheus's own per-target series, and kube-state-metrics' series behind
	// NetworkNodeManagerAgentMissing (a node where no agent runs has no agent metrics).
	external := map[string]bool{"up": true, "kube_node_info": true, "kube_node_status_condition": true,
		"kube_pod_info": true, "kube_pod_status_ready": true}
	known := func(name string) bool {
		if _, ok := registered[name]; ok || external[name] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok {
				if _, ok := registered[base]; ok {
					return true
				}
			}
		}
		return false
	}
	// Labels the scrape adds (components/podmonitor relabels the pod's node into node).
	targetLabels := []string{"node", "namespace", "pod", "instance", "job"}
	check := func(where, expr string) []string {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			if !known(n) {
				t.Errorf("%s: %s is not a metric the agent registers (expr %q)", where, n, expr)
			}
		}
		return names
	}

	alerted := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			for _, n := range check("alert "+r.Alert, r.Expr) {
				alerted[n] = true
			}
		}
	}

	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	shown := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range check("panel "+p.Title, tg.Expr) {
				shown[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		if !known(m[1]) || !slices.Contains(append(registered[m[1]], targetLabels...), m[2]) {
			t.Errorf("variable %s: %s has no label %s (registered labels %v)", v.Name, m[1], m[2], registered[m[1]])
		}
	}

	var perFix []string
	for name, labels := range registered {
		if strings.HasPrefix(name, "nnm_") && slices.Contains(labels, "fix") {
			perFix = append(perFix, name)
			if !shown[name] {
				t.Errorf("the dashboard does not show the per-fix metric %s", name)
			}
		}
	}
	sort.Strings(perFix)
	t.Logf("per-fix metrics on the dashboard: %v", perFix)

	// Every fix's own metrics (nnm_<fix id>_…): each is on the dashboard, and at least one of them
	// has an alert. A new fix with metrics fails here until it gets a panel and an alert.
	for _, id := range standardFixIDs(t) {
		prefix := "nnm_" + strings.ReplaceAll(id, "-", "_") + "_"
		var own []string
		for name := range registered {
			if strings.HasPrefix(name, prefix) {
				own = append(own, name)
			}
		}
		sort.Strings(own)
		hasAlert := false
		for _, name := range own {
			if !shown[name] {
				t.Errorf("fix %s: the dashboard does not show %s", id, name)
			}
			hasAlert = hasAlert || alerted[name]
		}
		if len(own) > 0 && !hasAlert {
			t.Errorf("fix %s: no alert uses any of its metrics %v", id, own)
		}
		t.Logf("fix %s: metrics %v", id, own)
	}
}

// standardFixIDs are the ids of fixes.Standard.
func standardFixIDs(t *testing.T) []string {
	t.Helper()
	var ids fix.IDs
	app := fx.New(fx.NopLogger, fixes.Standard, fx.Populate(&ids))
	if err := app.Err(); err != nil {
		t.Fatal(err)
	}
	if len(ids.IDs) < 5 {
		t.Fatalf("fixes.Standard registers %v", ids.IDs)
	}
	return ids.IDs
}
