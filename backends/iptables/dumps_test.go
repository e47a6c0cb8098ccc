package iptables

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// dumpGauge runs the binaries inside a namespace and records, for the iptables-save and
// iptables-restore runs, how many ran at once at most and how many ran in all. Each run is held for
// hold after it finished, so that callers which overlap it in time really do.
type dumpGauge struct {
	ns              *netns.NS
	hold            time.Duration
	now, max, total atomic.Int32
}

func (g *dumpGauge) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	if !strings.HasSuffix(name, "-save") && !strings.HasSuffix(name, "-restore") {
		return g.ns.Run(ctx, name, args, stdin, stdout)
	}
	g.total.Add(1)
	n := g.now.Add(1)
	defer g.now.Add(-1)
	for m := g.max.Load(); n > m && !g.max.CompareAndSwap(m, n); m = g.max.Load() {
	}
	stderr, err := g.ns.Run(ctx, name, args, stdin, stdout)
	time.Sleep(g.hold)
	return stderr, err
}

// TestOneDumpAtATime: the reads that take a whole dump of a family (a unit's verify, a scrape's
// counters, the predecessor's scan) and the restores (each iptables-nft-restore fetches the tables it
// changes), started together from many goroutines and both families, run one iptables-save or
// iptables-restore at a time in the kernel, and the counters of several fixes read in one scrape
// share a dump of each family.
func TestOneDumpAtATime(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-save", "ip6tables-nft-save")
	g := &dumpGauge{ns: netns.New(t, "nnm-dumps"), hold: 300 * time.Millisecond}
	ops, err := NewOps(Options{Variant: NFT, Runner: g, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Reads of every kind, in both families, at once.
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 16)
	for _, fam := range rules.Families {
		for range 2 {
			wg.Go(func() { <-start; _, err := ops.save(ctx, fam); errs <- err })
		}
		wg.Go(func() {
			<-start
			_, err := ops.dumpDeclaring(ctx, fam, func(string) bool { return false })
			errs <- err
		})
		wg.Go(func() {
			<-start
			errs <- ops.Check(ctx, backend.Unit{Fix: "invalid-drop", Family: fam}, invalidDrop(fam))
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := g.max.Load(); m != 1 {
		t.Errorf("%d iptables-save or -restore ran at once, want 1", m)
	}
	if n := g.total.Load(); n != 8 {
		t.Errorf("%d iptables-save and -restore ran, want one per read and check (8)", n)
	}

	// One scrape: the counters of eight fixes, in both families, at once.
	g.max.Store(0)
	g.total.Store(0)
	start = make(chan struct{})
	var failed atomic.Int32
	for i := range 8 {
		for _, fam := range rules.Families {
			wg.Go(func() {
				<-start
				u := backend.Unit{Fix: "fix-" + string(rune('a'+i)), Family: fam}
				if _, err := ops.Counters(ctx, u, nil, false); err != nil {
					t.Errorf("counters of %s (%s): %v", u.Fix, fam, err)
					failed.Add(1)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	if failed.Load() > 0 {
		return
	}
	if m := g.max.Load(); m != 1 {
		t.Errorf("%d iptables-save ran at once for the scrape, want 1", m)
	}
	// Each family's first caller dumps; every other call overlaps that dump (it is held 300 ms) or
	// the other family's, queued behind it: at most one more dump per family.
	if n := g.total.Load(); n < 2 || n > 4 {
		t.Errorf("the scrape of 16 counters ran %d iptables-save, want one or two per family", n)
	}
}

// TestDumpWaitEndsWithTheContext: a read queued behind another dump gives up when its context
// ends, with an error that says what it waited for.
func TestDumpWaitEndsWithTheContext(t *testing.T) {
	netns.RequireKernel(t, "iptables-nft-save")
	g := &dumpGauge{ns: netns.New(t, "nnm-dumps"), hold: 2 * time.Second}
	ops, err := NewOps(Options{Variant: NFT, Runner: g, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := ops.save(context.Background(), rules.IPv4); first <- err }()
	agenttest.Until(t, 5*time.Second, func() bool { return g.now.Load() > 0 }) // the first dump holds the gate
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = ops.save(ctx, rules.IPv6)
	if err == nil || !strings.Contains(err.Error(), "waiting for another iptables-save") {
		t.Errorf("a read queued past its deadline returned %v, want the wait named", err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := g.total.Load(); n != 1 {
		t.Errorf("%d iptables-save ran, want 1 (the queued read must not run)", n)
	}
}
