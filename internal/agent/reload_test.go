package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes/ipvsexternalipdnat"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/builtin"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// configMapDir lays out a directory the way the kubelet projects a ConfigMap volume:
//
//	dir/config.yaml -> ..data/config.yaml
//	dir/..data      -> ..<timestamp>
//	dir/..<timestamp>/config.yaml
//
// and updates it the same way: write a new timestamped directory, point a temporary symlink at it,
// rename that over ..data (atomic), delete the old directory. The file itself is never written.
type configMapDir struct {
	t       *testing.T
	dir     string
	current string
	n       int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	d := &configMapDir{t: t, dir: t.TempDir()}
	d.swap(content)
	if err := os.Symlink(filepath.Join("..data", "config.yaml"), filepath.Join(d.dir, "config.yaml")); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *configMapDir) file() string { return filepath.Join(d.dir, "config.yaml") }

func (d *configMapDir) swap(content string) {
	d.n++
	ts := "..2026_01_02_03_04_05." + string(rune('0'+d.n))
	if err := os.Mkdir(filepath.Join(d.dir, ts), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, ts, "config.yaml"), []byte(content), 0o644); err != nil {
		d.t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
	if d.current != "" {
		if err := os.RemoveAll(filepath.Join(d.dir, d.current)); err != nil {
			d.t.Fatal(err)
		}
	}
	d.current = ts
}

func TestConfigReloadOnConfigMapSymlinkSwap(t *testing.T) {
	d := newConfigMapDir(t, "fixes:\n  invalid-drop:\n    enabled: true\n")
	ids := []string{"invalid-drop"}
	env := []string{"NNM_CONFIG=" + d.file()}
	cfg, err := config.Load(nil, env, ids)
	if err != nil {
		t.Fatal(err)
	}
	if on, _ := cfg.FixEnabled("invalid-drop"); !on {
		t.Fatal("initial config: invalid-drop should be enabled")
	}
	m := metrics.NewSync(prometheus.NewRegistry())
	applied := make(chan *config.Config, 10)
	w := &configWatcher{file: cfg.File, load: func() (*config.Config, error) { return config.Load(nil, env, ids) },
		apply: func(c *config.Config) { applied <- c }, m: m, log: slog.New(slog.DiscardHandler), quiet: reloadQuiet, maxWait: reloadMaxWait}
	if err := w.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.stop(context.Background()) })

	expect := func(what string) *config.Config {
		t.Helper()
		select {
		case c := <-applied:
			return c
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no reload within 5s", what)
		}
		return nil
	}
	expectNone := func(what string) {
		t.Helper()
		select {
		case c := <-applied:
			t.Fatalf("%s: unexpected reload %+v", what, c.Fixes)
		case <-time.After(700 * time.Millisecond): // > the watcher's 200ms debounce
		}
	}

	// 1. The ConfigMap changes: the engine gets the new configuration.
	d.swap("fixes:\n  invalid-drop:\n    enabled: false\n")
	if on, explicit := expect("disable").FixEnabled("invalid-drop"); on || !explicit {
		t.Errorf("after swap: invalid-drop enabled=%v explicit=%v, want explicitly disabled", on, explicit)
	}

	// 2. A swap to identical content (the kubelet re-projects on resync) reconfigures nothing.
	d.swap("fixes:\n  invalid-drop:\n    enabled: false\n")
	expectNone("same content")

	// 3. A broken file is reported and the running configuration stays.
	d.swap("fixes:\n  invalid-drop:\n    enabled: maybe\n  no-such-fix: {}\n")
	expectNone("broken file")
	if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("error")); got != 1 {
		t.Errorf("config reload errors = %v, want 1", got)
	}

	// 4. Fixed again: applied.
	d.swap("minSyncPeriod: 3s\nfixes:\n  invalid-drop:\n    enabled: true\n")
	c := expect("re-enable")
	if on, _ := c.FixEnabled("invalid-drop"); !on || c.MinSyncPeriod != 3*time.Second {
		t.Errorf("after fix: invalid-drop=%v minSyncPeriod=%s", on, c.MinSyncPeriod)
	}
}

// A reload whose value no backend can render (a 15-character podInterfacePrefix: iptables' `-i x+`
// and nftables' `iifname "x*"` both need it at most 14) is rejected and counted as such, and the
// running options stay in force. (It used to pass validation, count as a successful reload and then
// fail every apply.)
func TestConfigReloadRejectsWhatBackendsCannotRender(t *testing.T) {
	const good = "proxyMode: ipvs\nfixes:\n  ipvs-externalip-dnat:\n    enabled: true\n    podInterfacePrefix: cali\n"
	d := newConfigMapDir(t, good)
	ids := []string{ipvsexternalipdnat.ID}
	env := []string{"NNM_CONFIG=" + d.file()}
	cfg, err := config.Load(nil, env, ids)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ipvsexternalipdnat.New(fix.Params{})
	if err != nil {
		t.Fatal(err)
	}
	ins, err := builtin.All()
	if err != nil {
		t.Fatal(err)
	}
	file, err := watch.LoadFile("../../examples/services.yaml", InputResources(ins))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewSync(prometheus.NewRegistry())
	be := testkit.NewFakeBackend()
	e, err := engine.New(engine.Options{Fixes: []fix.Fix{f}, Backend: be, Hub: FileHubOf(file, cfg, slog.New(slog.DiscardHandler)), Inputs: ins, Config: cfg,
		Env: fix.Env{ProxyMode: "ipvs"}, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	w := &configWatcher{file: cfg.File, load: func() (*config.Config, error) { return config.Load(nil, env, ids) },
		apply: e.Reconfigure, m: m, log: slog.New(slog.DiscardHandler), quiet: reloadQuiet, maxWait: reloadMaxWait}
	if err := w.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.stop(context.Background()) })

	d.swap(strings.Replace(good, "cali", "abcdefghijklmno", 1))
	agenttest.Until(t, 20*time.Second, func() bool { return testutil.ToFloat64(m.ConfigReloads.WithLabelValues("error")) > 0 })
	if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("error")); got != 1 {
		t.Errorf("rejected reloads = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.ConfigReloads.WithLabelValues("success")); got != 0 {
		t.Errorf("successful reloads = %v, want 0", got)
	}
	rulesets, _, err := e.Plan()
	if err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]bool{}
	for _, rs := range rulesets {
		if err := rs.Validate(); err != nil {
			t.Errorf("the running rules do not validate: %v", err)
		}
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				if r.Match.InInterfacePrefix != "" {
					prefixes[r.Match.InInterfacePrefix] = true
				}
			}
		}
	}
	if !prefixes["cali"] || len(prefixes) != 1 {
		t.Errorf("interface prefixes in the running rules = %v, want only the previous cali", prefixes)
	}
}

// A file written continuously (every 50 ms, more often than the quiet time) is still reloaded, at the
// latest maxWait after the first write (#15 item 8: the debounce used to restart on every event, so
// the reload waited until the writes stopped).
func TestConfigReloadUnderContinuousWrites(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte("minSyncPeriod: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	applied := make(chan *config.Config, 100)
	env := []string{"NNM_CONFIG=" + file}
	w := &configWatcher{file: file, load: func() (*config.Config, error) { return config.Load(nil, env, nil) },
		apply: func(c *config.Config) { applied <- c }, m: metrics.NewSync(prometheus.NewRegistry()),
		log: slog.New(slog.DiscardHandler), quiet: reloadQuiet, maxWait: time.Second}
	if err := w.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.stop(context.Background()) })

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 2; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			_ = os.WriteFile(file, []byte(fmt.Sprintf("minSyncPeriod: %dms\n", i)), 0o644)
		}
	}()
	defer func() { close(stop); <-done }()
	start := time.Now()
	select {
	case <-applied:
		t.Logf("reloaded %v after the writes began, while they went on", time.Since(start).Round(time.Millisecond))
	case <-time.After(4 * time.Second):
		t.Fatal("no reload within 4s of continuous writes (maxWait is 1s)")
	}
}

// logLevel applies on reload: the watcher, fed a ConfigMap swap from info to debug and back, changes
// the level of the logger it was built with, so debug lines appear and disappear without a restart.
func TestConfigReloadAppliesLogLevel(t *testing.T) {
	d := newConfigMapDir(t, "logLevel: info\n")
	env := []string{"NNM_CONFIG=" + d.file()}
	cfg, err := config.Load(nil, env, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	var mu sync.Mutex
	log, level, err := NewLoggerTo(&lockedWriter{w: &buf, mu: &mu}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan *config.Config, 10)
	w := &configWatcher{file: cfg.File, load: func() (*config.Config, error) { return config.Load(nil, env, nil) },
		apply: reloadApply(level, log, func(c *config.Config) { applied <- c }), m: metrics.NewSync(prometheus.NewRegistry()),
		log: log, quiet: reloadQuiet, maxWait: reloadMaxWait}
	if err := w.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.stop(context.Background()) })
	wait := func() {
		t.Helper()
		select {
		case <-applied:
		case <-time.After(5 * time.Second):
			t.Fatal("no reload within 5s")
		}
	}
	log.Debug("before: hidden")
	d.swap("logLevel: debug\n")
	wait()
	log.Debug("at debug: shown")
	d.swap("logLevel: warn\n")
	wait()
	log.Info("at warn: hidden")
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"at debug: shown", `msg="log level changed" from=INFO to=DEBUG`, `msg="log level changed" from=DEBUG to=WARN`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	for _, hidden := range []string{"before: hidden", "at warn: hidden"} {
		if strings.Contains(out, hidden) {
			t.Errorf("log has %q:\n%s", hidden, out)
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
