//go:build profile

// Built only with `-tags profile` (the scale benchmark's `-profile` option, see BENCHMARKS.md): on
// SIGUSR1 the agent writes a heap profile (in-use and allocated space since start) and its runtime
// memory statistics to the directory named by NNMBENCH_PROFILE_DIR. The stock binary has none of it.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"
)

// ProfileDirEnv names the directory the profiles are written to.
const ProfileDirEnv = "NNMBENCH_PROFILE_DIR"

func init() {
	dir := os.Getenv(ProfileDirEnv)
	if dir == "" {
		return
	}
	go samplePeakLiveHeap(dir)
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	go func() {
		for range c {
			if err := writeProfiles(dir); err != nil {
				fmt.Fprintln(os.Stderr, "profile:", err)
			}
		}
	}()
}

// peakLiveHeap is the largest live heap any GC cycle so far marked (/gc/heap/live:bytes, updated
// at the end of each cycle): what GOMEMLIMIT must stay above, which the heap in use at a snapshot
// does not show.
var peakLiveHeap atomic.Uint64

// samplePeakLiveHeap keeps peakLiveHeap, and writes the heap profile of each new peak (1 MiB above
// the last one written) to heap-peak.pb.gz: a heap profile's in-use figures are those of the last
// finished GC cycle, so that profile shows what was live at the peak.
func samplePeakLiveHeap(dir string) {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var written uint64
	for {
		metrics.Read(s)
		if v := s[0].Value.Uint64(); v > peakLiveHeap.Load() {
			peakLiveHeap.Store(v)
			if v > written+1<<20 {
				written = v
				if f, err := os.Create(filepath.Join(dir, "heap-peak.pb.gz")); err == nil {
					_ = pprof.Lookup("heap").WriteTo(f, 0)
					f.Close()
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func writeProfiles(dir string) error {
	stamp := time.Now().UTC().Format("150405.000000")
	var ms struct {
		runtime.MemStats
		PeakLiveHeap uint64 // bytes, since start
	}
	runtime.ReadMemStats(&ms.MemStats)
	ms.PeakLiveHeap = peakLiveHeap.Load()
	b, err := json.MarshalIndent(ms, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "memstats-"+stamp+".json"), b, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "heap-"+stamp+".pb.gz"))
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}
