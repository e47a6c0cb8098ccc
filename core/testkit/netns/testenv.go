// The rule for tests whose prerequisites are missing.
//
// A missing prerequisite (not root, no `ip netns`, a kernel feature, the control plane, a VM) skips
// the test with a clear message on a developer's machine, and FAILS it under CI: when CI=true or
// NNM_REQUIRE_KERNEL=1 (set by .ci/run), so that a green CI run means every suite ran.

package netns

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// RequireEnv names the variable that turns missing prerequisites into failures (.ci/run sets it).
const RequireEnv = "NNM_REQUIRE_KERNEL"

// Strict reports whether missing prerequisites fail the test instead of skipping it: RequireEnv or
// CI (the variable CI systems set) is true.
func Strict() bool {
	for _, name := range []string{RequireEnv, "CI"} {
		if v, err := strconv.ParseBool(os.Getenv(name)); err == nil && v {
			return true
		}
	}
	return false
}

// Unavailable ends the test because something it needs is missing here: it skips with the message,
// or fails with it when Strict. Every skip for a missing root, namespace, kernel feature, binary,
// control plane or VM goes through here.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		tb.Fatalf("required here (%s=1 or CI=true) but unavailable: %s", RequireEnv, msg)
		return
	}
	tb.Skipf("skipping: %s (set %s=1 to make this a failure)", msg, RequireEnv)
}

// RequireRoot ends the test (Unavailable) unless it runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Unavailable(tb, "needs root to create network namespaces (CI runs as root; euid %d)", os.Geteuid())
	}
}

// RequireKernel starts a kernel test: it skips under -short (`make test-unit` runs no kernel test),
// then ends the test (Require) unless it runs as root with `ip` and the named binaries in PATH.
func RequireKernel(tb testing.TB, binaries ...string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("kernel test: skipped with -short")
	}
	Require(tb, binaries...)
}

// Require ends the test (Unavailable) unless it runs as root with iproute2's `ip` and the named
// binaries in PATH.
func Require(tb testing.TB, binaries ...string) {
	tb.Helper()
	RequireRoot(tb)
	for _, b := range append([]string{"ip"}, binaries...) {
		if _, err := exec.LookPath(b); err != nil {
			Unavailable(tb, "needs %s in PATH (make test installs it): %v", b, err)
		}
	}
}
