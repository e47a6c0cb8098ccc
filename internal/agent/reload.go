package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/logging"
)

// WatchConfig reloads the config file when it changes and hands the result to the engine, so that
// enabling, disabling or tuning a fix in a ConfigMap needs no redeploy. The directory is watched, not
// the file, because a mounted ConfigMap is updated by swapping a symlink. A file that no longer loads
// is logged, counted and posted on the Node (ConfigReloadRejected); the running configuration stays.
//
// viper.WatchConfig is not used: it re-reads into one viper instance (our Load merges the file with
// the environment and flags each time and must be able to refuse the result as a whole), it has no
// debounce, and its goroutine cannot be stopped, which an fx Stop hook and goleak need.
//
// The loaded file goes to the engine through NodeOverrides, which resolves its nodeOverrides for
// this node: the engine takes the configuration in effect here.
func WatchConfig(lc fx.Lifecycle, cfg *config.Config, in Inputs, ids fix.IDs, o *NodeOverrides, m *metrics.Sync, ev EventsIn, log *slog.Logger, level *slog.LevelVar) {
	if cfg.File == "" {
		return
	}
	w := &configWatcher{file: cfg.File, load: func() (*config.Config, error) { return config.Load(in.Flags, in.Environ, ids.IDs, ids.Legacy...) },
		apply: reloadApply(level, log, o.Apply), rejected: ev.Recorder.ConfigRejected, m: m, log: log, quiet: reloadQuiet, maxWait: reloadMaxWait}
	lc.Append(fx.Hook{OnStart: w.start, OnStop: w.stop})
}

// A burst of writes (the kubelet's symlink swap is several events) is reloaded once it has been
// quiet for reloadQuiet, and at the latest reloadMaxWait after its first event, so a file written
// continuously is still reloaded.
const (
	reloadQuiet   = 200 * time.Millisecond
	reloadMaxWait = 2 * time.Second
)

type configWatcher struct {
	file  string
	load  func() (*config.Config, error)
	apply func(*config.Config)
	// rejected hears why a changed file was not taken.
	rejected func(error)
	m        *metrics.Sync
	log      *slog.Logger

	quiet, maxWait time.Duration

	last   []byte
	fsw    *fsnotify.Watcher
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (w *configWatcher) start(context.Context) error {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	if err := fsw.Add(filepath.Dir(w.file)); err != nil {
		fsw.Close()
		return err
	}
	w.fsw = fsw
	w.last, _ = os.ReadFile(w.file)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.loop(ctx)
	}()
	return nil
}

func (w *configWatcher) loop(ctx context.Context) {
	var debounce <-chan time.Time
	var first time.Time // first event of the burst not yet reloaded
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.fsw.Events:
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			debounce = time.After(min(w.quiet, max(0, first.Add(w.maxWait).Sub(now))))
		case err := <-w.fsw.Errors:
			w.log.Warn("config watch error", "err", err)
		case <-debounce:
			debounce, first = nil, time.Time{}
			w.reload()
		}
	}
}

func (w *configWatcher) reload() {
	data, err := os.ReadFile(w.file)
	if err != nil || bytes.Equal(data, w.last) {
		return
	}
	w.last = data
	cfg, err := w.load()
	if err != nil {
		w.log.Error("config file changed but does not load; keeping the running configuration", "file", w.file, "err", err)
		w.m.ConfigReloads.WithLabelValues("error").Inc()
		if w.rejected != nil {
			w.rejected(err)
		}
		return
	}
	w.apply(cfg)
}

func (w *configWatcher) stop(context.Context) error {
	w.cancel()
	err := w.fsw.Close()
	w.wg.Wait()
	return err
}

// reloadApply is what a loaded config file does: it sets the level of the agent's logger (and of
// client-go's lines routed into it) to its logLevel, then hands it to the engine. The level was
// validated when the file loaded.
func reloadApply(level *slog.LevelVar, log *slog.Logger, reconfigure func(*config.Config)) func(*config.Config) {
	return func(c *config.Config) {
		for _, w := range c.Warnings {
			log.Warn("config: " + w)
		}
		if l, err := logging.ParseLevel(c.LogLevel); err == nil && l != level.Level() {
			old := level.Level()
			level.Set(l)
			log.Log(context.Background(), max(old, l), "log level changed", "from", old.String(), "to", l.String())
		}
		reconfigure(c)
	}
}
