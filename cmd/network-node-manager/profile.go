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
	"runtime/pprof"
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

func writeProfiles(dir string) error {
	stamp := time.Now().UTC().Format("150405.000000")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
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
