package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// profileEnv names the directory a `-tags profile` agent writes its heap profiles to on SIGUSR1
// (cmd/network-node-manager/profile.go).
const profileEnv = "NNMBENCH_PROFILE_DIR"

// buildProfiling builds the agent with -tags profile into dir and returns its path.
func buildProfiling(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "network-node-manager-profile")
	cmd := exec.Command("go", "build", "-tags", "profile", "-o", bin, "./cmd/network-node-manager") // make build's flags: its build cache applies
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the profiling agent: %w\n%s", err, out)
	}
	return bin, nil
}

// snapProfile asks the agent for a heap profile and names it after the phase.
func snapProfile(dir string, pid int, name string) error {
	before, _ := filepath.Glob(filepath.Join(dir, "heap-*.pb.gz"))
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		after, _ := filepath.Glob(filepath.Join(dir, "heap-*.pb.gz"))
		if len(after) > len(before) {
			for _, f := range after {
				if !contains(before, f) {
					time.Sleep(200 * time.Millisecond) // let the writer finish
					to := filepath.Join(dir, name+".pb.gz")
					if err := os.Rename(f, to); err != nil {
						return err
					}
					logf("heap profile %s", to)
					return nil
				}
			}
		}
	}
	return fmt.Errorf("no heap profile appeared in %s", dir)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
