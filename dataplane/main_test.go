package dataplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// One control plane (etcd + kube-apiserver) serves every test of the package. It starts on first use,
// so tests that need none do not pay for it, and stops when the package's tests end.
var shared struct {
	once sync.Once
	cp   *controlplane.ControlPlane
	skip string // why tests that need it skip
	err  error  // why they fail
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.cp != nil {
		if err := shared.cp.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close control plane:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// controlPlane returns the shared control plane, starting it and creating the cluster objects
// (seedCluster) on first use; it ends the test when the machine cannot run one (netns.Unavailable).
func controlPlane(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	shared.once.Do(func() {
		if err := controlplane.CheckPrerequisites(""); err != nil {
			if errors.Is(err, controlplane.ErrUnavailable) {
				shared.skip = err.Error()
				return
			}
			shared.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		cp, err := controlplane.Start(ctx, controlplane.Options{})
		if err != nil {
			shared.err = fmt.Errorf("start control plane: %w", err)
			return
		}
		shared.cp = cp
		if err := seedCluster(ctx, cp); err != nil {
			shared.err = fmt.Errorf("control plane setup: %w\n%s", err, cp.LogTails())
			return
		}
		t.Logf("control plane %s ready in %v", cp.Netns(), time.Since(start).Round(time.Millisecond))
	})
	if shared.skip != "" {
		netns.Unavailable(t, "%s", shared.skip)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.cp
}
