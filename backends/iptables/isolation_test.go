package iptables

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// TestKernelBlockedUnitDelaysNoOther: one fix's iptables-restore waits for the xtables lock, which
// another process holds (here the test, on a lock file of its own through XTABLES_LOCKFILE, so the
// host's lock is never touched). Meanwhile a Verify of another fix, which reads the kernel, and
// scrapes of both fixes' counters finish; the blocked change lands once the lock is free. With one
// mutex per backend they all queued behind the restore.
func TestKernelBlockedUnitDelaysNoOther(t *testing.T) {
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) {
			k := newKernel(t, Legacy, f)
			lock := filepath.Join(t.TempDir(), "xtables.lock")
			t.Setenv("XTABLES_LOCKFILE", lock)
			b := mustBackend(t, Options{Variant: Legacy, Runner: k.run, LockWait: 60})
			ctx := context.Background()
			blocked, other := loopbackCount(f), invalidDrop(f)
			mustApply(t, b, blocked, other)

			fd, err := os.OpenFile(lock, os.O_CREATE|os.O_RDWR, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			if err := unix.Flock(int(fd.Fd()), unix.LOCK_EX); err != nil {
				t.Fatal(err)
			}
			k.run.reset()
			changed := loopbackCount(f)
			changed.Chains[0].Rules = append(changed.Chains[0].Rules, rules.Rule{Match: rules.Match{Protocol: rules.UDP, DstPort: probePort}, Counter: "probe-udp"})
			done := make(chan error, 1)
			go func() {
				_, err := b.Reconcile(ctx, blocked.Fix, f, changed, backend.Trust)
				done <- err
			}()
			restore := k.bin("restore")
			if err := agenttest.Poll(ctx, 10*time.Second, 10*time.Millisecond, func() error {
				if k.run.calls.Get(restore) == 0 {
					return fmt.Errorf("the change of %s has not started %s", blocked.Fix, restore)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			others := make(chan error, 1)
			go func() {
				res, err := b.Reconcile(ctx, other.Fix, f, other, backend.Verify)
				if err == nil && (!res.ReadBack || res.Applied) {
					err = fmt.Errorf("Verify of %s: %+v; want a read-back and no change", other.Fix, res)
				}
				for _, fix := range []string{blocked.Fix, other.Fix} {
					if err == nil {
						_, err = b.Counters(ctx, fix, f)
					}
				}
				others <- err
			}()
			select {
			case err := <-others:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("a Verify of %s and two scrapes waited for %s's blocked restore", other.Fix, blocked.Fix)
			}
			select {
			case err := <-done:
				t.Fatalf("the change of %s finished (%v) while the xtables lock was held", blocked.Fix, err)
			default:
			}
			if err := unix.Flock(int(fd.Fd()), unix.LOCK_UN); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("the blocked change after the lock was freed: %v", err)
			}
			if save := k.save(); !strings.Contains(save, "-p udp") {
				t.Errorf("the blocked change is not in the kernel:\n%s", save)
			}
		})
	}
}
