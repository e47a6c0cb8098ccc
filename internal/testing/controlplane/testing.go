package controlplane

import (
	"errors"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// StartT starts a control plane for a test: it ends the test when the
// machine cannot run one (netns.Unavailable: a skip, or a failure under CI) (see CheckPrerequisites), fails it when Start fails,
// and registers Close with tb.Cleanup. If the test failed, the tails of the
// component logs are logged before teardown.
func StartT(tb testing.TB, opts Options) *ControlPlane {
	tb.Helper()
	if err := CheckPrerequisites(opts.BinDir); err != nil {
		if errors.Is(err, ErrUnavailable) {
			netns.Unavailable(tb, "%v", err)
			return nil
		}
		tb.Fatal(err)
	}
	ctx := tb.Context()
	cp, err := Start(ctx, opts)
	if err != nil {
		tb.Fatalf("start control plane: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("control plane %s logs:\n%s", cp.Netns(), cp.LogTails())
		}
		if err := cp.Close(); err != nil {
			tb.Errorf("close control plane: %v", err)
		}
	})
	return cp
}

// LogTails returns the last lines of the etcd and kube-apiserver logs.
func (c *ControlPlane) LogTails() string {
	s := tailFile(c.logPath("etcd"), 30) + "\n" + tailFile(c.logPath("kube-apiserver"), 30)
	if c.opts.Controllers {
		s += "\n" + tailFile(c.logPath("kube-controller-manager"), 30) + "\n" + tailFile(c.logPath("kube-scheduler"), 30)
	}
	return s
}
