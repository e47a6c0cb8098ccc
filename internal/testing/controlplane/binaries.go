package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// BinDirEnv overrides the directory holding the etcd and kube-apiserver binaries.
const BinDirEnv = "NNM_BIN_DIR"

// ErrUnavailable is wrapped by every error CheckPrerequisites returns: tests
// skip on it instead of failing.
var ErrUnavailable = errors.New("control plane unavailable")

const buildHint = "run `make controlplane` (hack/build-controlplane.sh) to build them"

// binaries holds the absolute paths of the executables the control plane needs.
type binaries struct {
	etcd, apiserver, ip string
	// with Options.Controllers only
	controllerManager, scheduler string
}

// CheckPrerequisites reports why a control plane cannot start on this machine
// (not root, no `ip netns`, binaries missing), wrapping ErrUnavailable, or nil.
// binDir may be empty to use the default location (see Options.BinDir).
func CheckPrerequisites(binDir string) error {
	_, err := findBinaries(binDir, false)
	return err
}

// findBinaries locates the binaries; with controllers also kube-controller-manager and
// kube-scheduler.
func findBinaries(binDir string, controllers bool) (binaries, error) {
	if os.Geteuid() != 0 {
		return binaries{}, fmt.Errorf("%w: needs root to create network namespaces (euid %d)", ErrUnavailable, os.Geteuid())
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return binaries{}, fmt.Errorf("%w: iproute2 `ip` not found in PATH: %v", ErrUnavailable, err)
	}
	if out, err := exec.Command(ip, "netns", "list").CombinedOutput(); err != nil {
		return binaries{}, fmt.Errorf("%w: `ip netns list` failed: %v: %s", ErrUnavailable, err, out)
	}
	dir, err := resolveBinDir(binDir)
	if err != nil {
		return binaries{}, err
	}
	b := binaries{etcd: filepath.Join(dir, "etcd"), apiserver: filepath.Join(dir, "kube-apiserver"), ip: ip}
	for _, p := range []string{b.etcd, b.apiserver} {
		if err := checkExecutable(p); err != nil {
			return binaries{}, fmt.Errorf("%w: %v; %s", ErrUnavailable, err, buildHint)
		}
	}
	if controllers {
		b.controllerManager, b.scheduler = filepath.Join(dir, "kube-controller-manager"), filepath.Join(dir, "kube-scheduler")
		for _, p := range []string{b.controllerManager, b.scheduler} {
			if err := checkExecutable(p); err != nil {
				return binaries{}, fmt.Errorf("%w: %v; run hack/cluster/build.sh (make test-cluster builds them)", ErrUnavailable, err)
			}
		}
	}
	return b, nil
}

// resolveBinDir picks, in order: the explicit directory, $NNM_BIN_DIR, and
// <repo root>/bin where the repo root is the first directory above this
// source file that holds a go.mod.
func resolveBinDir(explicit string) (string, error) {
	if explicit != "" {
		return filepath.Abs(explicit)
	}
	if env := os.Getenv(BinDirEnv); env != "" {
		return filepath.Abs(env)
	}
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("%w: cannot locate binaries (set %s): %v", ErrUnavailable, BinDirEnv, err)
	}
	return filepath.Join(root, "bin"), nil
}

func repoRoot() (string, error) {
	start, err := os.Getwd()
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		start, err = filepath.Dir(file), nil // not built with -trimpath
	}
	if err != nil {
		return "", err
	}
	for dir := start; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod in %s or above", start)
		}
	}
}

func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("binary %s missing", path)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("binary %s is not executable", path)
	}
	return nil
}
