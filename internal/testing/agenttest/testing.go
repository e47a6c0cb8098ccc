package agenttest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// StopGrace is how long Stop waits after SIGTERM in the test helpers.
const StopGrace = 15 * time.Second

// Require ends the test when the agent cannot run here (see CheckPrerequisites): a skip, or a failure
// under CI (netns.Unavailable).
func Require(tb testing.TB) {
	tb.Helper()
	if err := CheckPrerequisites(); err != nil {
		if errors.Is(err, ErrUnavailable) {
			netns.Unavailable(tb, "%v", err)
			return
		}
		tb.Fatal(err)
	}
}

// StartT starts the agent for a test: it skips when the agent cannot run (Require), fails the test when
// it cannot start, and stops the agent when the test ends, printing the log tail if the test failed.
// The log file lives in tb.TempDir() unless opts.LogFile is set.
func StartT(tb testing.TB, opts Options) *Agent {
	tb.Helper()
	Require(tb)
	if opts.LogFile == "" {
		opts.LogFile = tb.TempDir() + "/agent.log"
	}
	a, err := Start(opts)
	if err != nil {
		tb.Fatalf("start agent: %v", err)
	}
	tb.Cleanup(func() {
		err := a.Stop(StopGrace)
		if tb.Failed() {
			tb.Logf("agent log (%s), last 60 lines:\n%s", a.LogPath(), a.LogTail(60))
			tb.Logf("agent log, last 30 warnings and errors:\n%s", a.LogWarnings(30))
		}
		if err != nil {
			tb.Errorf("stop agent: %v", err)
		}
	})
	return a
}

// WaitReadyT is WaitReady that fails the test (with the log tail) on error.
func (a *Agent) WaitReadyT(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	if err := a.WaitReady(tb.Context(), timeout); err != nil {
		tb.Fatalf("agent in %s not ready: %v\nlog tail:\n%s", a.Netns(), err, a.LogTail(40))
	}
}

// MetricsScrapeTimeout bounds MetricsT's retries: on a busy machine (CI's two cores shared by parallel
// packages, or a VM under emulation) one scrape can outlast the client's timeout.
const MetricsScrapeTimeout = 20 * time.Second

// MetricsT is Metrics that retries failed scrapes for up to MetricsScrapeTimeout (unless the agent
// exited) and then fails the test with the last error.
func (a *Agent) MetricsT(tb testing.TB) Metrics {
	tb.Helper()
	var m Metrics
	err := Poll(tb.Context(), MetricsScrapeTimeout, 200*time.Millisecond, func() (err error) {
		if exited := a.Exited(); exited != nil {
			return Permanent(fmt.Errorf("agent exited: %w", exited))
		}
		m, err = a.Metrics(tb.Context())
		return err
	})
	if err != nil {
		tb.Fatalf("scrape agent metrics in %s: %v", a.Netns(), err)
	}
	return m
}

// Eventually polls cond every 50 ms until it returns nil and fails the test with cond's last error
// after timeout. It returns how long it took.
func Eventually(tb testing.TB, timeout time.Duration, cond func() error) time.Duration {
	tb.Helper()
	start := time.Now()
	if err := Poll(tb.Context(), timeout, 50*time.Millisecond, cond); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// Until polls ok every 10 ms until it is true and fails the test after timeout (at the caller's
// line): Eventually for a condition that has no error to tell.
func Until(tb testing.TB, timeout time.Duration, ok func() bool) {
	tb.Helper()
	err := Poll(tb.Context(), timeout, 10*time.Millisecond, func() error {
		if ok() {
			return nil
		}
		return errors.New("still false")
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// Consistently fails the test if cond returns an error at any poll during duration.
func Consistently(tb testing.TB, duration time.Duration, cond func() error) {
	tb.Helper()
	if err := Holds(tb.Context(), duration, 100*time.Millisecond, cond); err != nil {
		tb.Fatalf("condition broke within %v: %v", duration, err)
	}
}
