package config_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/spf13/pflag"

	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/config/configtest"
)

// fixIDs are the agent's fixes, as the largest file names them.
var fixIDs = []string{"conntrack-liberal", "invalid-drop", "ipvs-externalip-dnat", "mss-clamp", "stale-udp-conntrack"}

// loadLargest writes configtest.Largest and returns a loader of it, as the agent loads its file at
// start and at each reload.
func loadLargest(tb testing.TB) (load func() (*config.Config, error), size int) {
	return loadFile(tb, configtest.Largest())
}

// loadFile writes data and returns a loader of it.
func loadFile(tb testing.TB, data []byte) (load func() (*config.Config, error), size int) {
	file := filepath.Join(tb.TempDir(), "config.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	return func() (*config.Config, error) {
		fs := pflag.NewFlagSet("load", pflag.ContinueOnError)
		config.AddFlags(fs)
		if err := fs.Parse([]string{"--config", file}); err != nil {
			return nil, err
		}
		return config.Load(fs, nil, fixIDs)
	}, len(data)
}

// MaxLoadAllocFactor bounds what loading a file allocates, as a multiple of the file's size: about
// 30 for go-yaml's node tree (the lines that errors name), 17 for decoding it, the rest for the
// key paths and the entries' selectors.
const MaxLoadAllocFactor = 100

// TestLargestFileLoadAllocatesBoundedMultiple (issue #63 row 3): loading the largest file the agent
// accepts (1 MiB, configtest.LargestEntries nodeOverrides entries) allocates at most
// MaxLoadAllocFactor times its size. At main 3f85643 one load allocated 361 MB, 344 times the file
// (260 MB of it in a strings.Replacer built per option key), and the agent's RSS grew with every
// reload past the DaemonSet's limit.
func TestLargestFileLoadAllocatesBoundedMultiple(t *testing.T) {
	// A quarter of the file costs a quarter: the factor does not grow with the text.
	for _, size := range []int{config.MaxFileSize / 4, config.MaxFileSize} {
		load, n := loadFile(t, configtest.File(size))
		cfg, err := load() // warm: package-level state built once
		if err != nil {
			t.Fatal(err)
		}
		entries := len(cfg.NodeOverrides())
		if size == config.MaxFileSize && entries != configtest.LargestEntries {
			t.Fatalf("%d nodeOverrides entries loaded, want %d", entries, configtest.LargestEntries)
		}
		var before, after, held runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cfg, err = load()
		if err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		runtime.GC()
		runtime.ReadMemStats(&held)
		runtime.KeepAlive(cfg)
		alloc := after.TotalAlloc - before.TotalAlloc
		factor := float64(alloc) / float64(n)
		t.Logf("one load of %d bytes (%d entries): %.1f MB allocated in %d objects, %.1f times the file; the loaded configuration holds %.1f MB",
			n, entries, float64(alloc)/1e6, after.Mallocs-before.Mallocs, factor, float64(int64(held.HeapAlloc)-int64(before.HeapAlloc))/1e6)
		if factor > MaxLoadAllocFactor {
			t.Errorf("one load of %d bytes allocated %.1f times the file's size, want at most %d", n, factor, MaxLoadAllocFactor)
		}
	}
}

// BenchmarkLoadLargestFile is one load of the largest accepted file (what a reload costs before the
// engine takes the result): `go test -run '^$' -bench LoadLargestFile -benchmem ./internal/config/`.
func BenchmarkLoadLargestFile(b *testing.B) {
	load, size := loadLargest(b)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := load(); err != nil {
			b.Fatal(err)
		}
	}
}
