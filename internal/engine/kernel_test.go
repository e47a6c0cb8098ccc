package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/backends/iptables"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// slowReadBack runs the iptables binaries in a test namespace; once armed, every iptables-save
// (the read-back of a Verify) first waits for a real child process that takes 30 s, as a read-back of
// a huge ruleset on a loaded node may, and which only the caller's context ending stops.
type slowReadBack struct {
	ns       *netns.NS
	armed    atomic.Bool
	started  atomic.Int32
	canceled atomic.Int32
}

func (r *slowReadBack) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	if strings.HasSuffix(name, "-save") && r.armed.Load() {
		r.started.Add(1)
		if _, err := r.ns.Run(ctx, "sleep", []string{"30"}, nil, nil); ctx.Err() != nil {
			r.canceled.Add(1)
			return nil, ctx.Err()
		} else if err != nil {
			return nil, err
		}
	}
	return r.ns.Run(ctx, name, args, stdin, stdout)
}

// TestKernelChangePreemptsReadBack: with the real iptables backend in a test namespace (IPv4 and
// IPv6, each family a unit of its own), a periodic
// Verify whose read-back of the kernel hangs does not hold back a change of Services. The engine
// cancels the read-back (its child process is killed), the change reaches the kernel, and the
// preempted Verify is not counted as a failure. Without preemption the change would wait the 30 s
// of the read-back (the backend serialises its kernel operations).
func TestKernelChangePreemptsReadBack(t *testing.T) {
	netns.Require(t, "iptables-nft", "iptables-nft-save", "iptables-nft-restore", "ip6tables-nft-save", "ip6tables-nft-restore")
	ns := netns.New(t, "nnm-eng")
	run := &slowReadBack{ns: ns}
	// With a Runner of its own the backend has no nf_tables generation: every Verify reads back.
	be, err := iptables.New(iptables.Options{Variant: iptables.NFT, Runner: run, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	src.set(svc("a", "10.96.0.1", "fd00::1"))
	c := config.Defaults()
	c.Families = []string{"ipv4", "ipv6"}
	c.MinSyncPeriod = 10 * time.Millisecond
	e := mustNew(t, Options{Fixes: []fix.Fix{&countFix{id: "count", defaultOn: true}}, Backend: be, Hub: src.hub, Inputs: src.ins(), Config: &c})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		run.armed.Store(false)
		if err := e.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	inKernel := func(ips ...string) bool {
		save := ns.MustExec("iptables-nft-save", "-t", "filter") + ns.MustExec("ip6tables-nft-save", "-t", "filter")
		for _, ip := range ips {
			if !strings.Contains(save, ip) {
				return false
			}
		}
		return true
	}
	agenttest.Until(t, wait, func() bool { return inKernel("10.96.0.1", "fd00::1") })

	run.armed.Store(true)
	e.Reconfigure(&c) // a full pass, as the periodic resync starts one
	agenttest.Until(t, wait, func() bool { return run.started.Load() >= 1 })
	changed := time.Now()
	src.set(svc("a", "10.96.0.1", "fd00::1"), svc("b", "10.96.0.2", "fd00::2"))
	// 20 s: the hung read-back would end after 30 s.
	err = agenttest.Poll(t.Context(), 20*time.Second, 20*time.Millisecond, func() error {
		if !inKernel("10.96.0.2", "fd00::2") {
			return fmt.Errorf("the change did not reach the kernel while a Verify read the kernel back (read-backs started %d, canceled %d)",
				run.started.Load(), run.canceled.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("change in the kernel %v after the Services changed, during a hung read-back", time.Since(changed).Round(time.Millisecond))
	if run.canceled.Load() < 1 {
		t.Errorf("the hung read-back was not canceled (started %d)", run.started.Load())
	}
	if err := e.Healthy(); err != nil {
		t.Errorf("a preempted Verify must not count as a failure: %v", err)
	}
}
