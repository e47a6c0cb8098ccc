package iptables

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// toolCounter runs the binaries and counts the saves and the one-chain lists (-S CHAIN) among them.
type toolCounter struct {
	Runner
	mu           sync.Mutex
	saves, lists int
}

func (c *toolCounter) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	c.mu.Lock()
	switch {
	case strings.HasSuffix(name, "-save"):
		c.saves++
	case slices.Contains(args, "-S"):
		c.lists++
	}
	c.mu.Unlock()
	return c.Runner.Run(ctx, name, args, stdin, stdout)
}

func (c *toolCounter) take() (saves, lists int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	saves, lists, c.saves, c.lists = c.saves, c.lists, 0, 0
	return saves, lists
}

// TestKernelReadBackOfLargeChange: a change that rewrites more than readBackListMax chains (here:
// 900 entries added at once, tens of new buckets and dispatch nodes) reads them back with one
// iptables-save instead of a list per chain, and the record it makes is the kernel's (a Verify
// finds nothing to repair); a change of one entry still lists its chains, and its record is right.
func TestKernelReadBackOfLargeChange(t *testing.T) {
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) {
			ctx := context.Background()
			k := newKernel(t, NFT, f)
			count := &toolCounter{Runner: k.run}
			b := mustBackend(t, Options{Variant: NFT, Runner: count, Generation: k.generation})
			all := scaleEntries(f, 1000)
			rs := func(e []rules.MapEntry) *rules.Ruleset {
				r := externalIP(f)
				r.Maps[0].Entries = e
				return r
			}
			if err := apply(ctx, b, rs(all[:100])); err != nil {
				t.Fatal(err)
			}
			count.take()
			if err := apply(ctx, b, rs(all)); err != nil {
				t.Fatal(err)
			}
			if saves, lists := count.take(); saves != 1 || lists != 0 {
				t.Fatalf("900 entries added: %d saves and %d one-chain lists, want the read-back in 1 save and no list", saves, lists)
			}
			if ok, err := inSync(ctx, b, rs(all)); err != nil || !ok {
				t.Fatalf("after the large change a Verify repaired the kernel (in sync %v, %v): the record read back is not the kernel's", ok, err)
			}
			one := slices.Clone(all)
			one[500].Port = 81
			count.take()
			if err := apply(ctx, b, rs(one)); err != nil {
				t.Fatal(err)
			}
			if saves, lists := count.take(); saves != 0 || lists == 0 || lists > readBackListMax {
				t.Fatalf("one entry changed: %d saves and %d one-chain lists, want lists only", saves, lists)
			}
			if ok, err := inSync(ctx, b, rs(one)); err != nil || !ok {
				t.Fatalf("after a one-entry change a Verify repaired the kernel (in sync %v, %v)", ok, err)
			}
		})
	}
}
