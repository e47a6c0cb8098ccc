package nftables

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestKernelBlockedUnitDelaysNoOther: one fix's `nft -f` hangs (held before it runs). Meanwhile
// another fix's change goes into the kernel, a Verify of it finishes, and the blocked fix's counters
// are read; the blocked transaction lands once released. With one mutex per backend they all
// queued behind it.
func TestKernelBlockedUnitDelaysNoOther(t *testing.T) {
	eachFamily(t, "nnm-nft", func(t *testing.T, ns *netns.NS, f rules.Family) {
		ctx := context.Background()
		k := newRealKernel()
		b := k.backend(t)
		blocked, other := externalIPRuleset(f, threeEntries(f)), invalidDropRuleset(f)
		applyIn(ctx, t, ns, b, blocked, other)
		started, release := make(chan struct{}), make(chan struct{})
		k.rec(nftFamily(f), TableName(blocked.Fix)).inject = func(*knftables.Transaction) error {
			close(started)
			<-release
			return nil
		}
		changed := externalIPRuleset(f, threeEntries(f)[:2])
		done := make(chan error, 1)
		go func() {
			done <- ns.Do(func() error {
				_, err := b.Reconcile(ctx, blocked.Fix, f, changed, backend.Trust)
				return err
			})
		}()
		<-started

		others := make(chan error, 1)
		go func() {
			others <- ns.Do(func() error {
				more := invalidDropRuleset(f)
				more.Chains[1].Rules[0].Counter = "probe-2"
				for _, mode := range []backend.Mode{backend.Trust, backend.Verify} {
					if _, err := b.Reconcile(ctx, more.Fix, f, more, mode); err != nil {
						return err
					}
				}
				_, err := b.Counters(ctx, blocked.Fix, f)
				return err
			})
		}()
		select {
		case err := <-others:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("a change and a Verify of %s and a scrape of %s waited for %s's hanging nft", other.Fix, blocked.Fix, blocked.Fix)
		}
		if got := nftList(t, ns, "list", "table", string(nftFamily(f)), TableName(other.Fix)); !strings.Contains(got, "probe-2") {
			t.Errorf("the other fix's change is not in the kernel:\n%s", got)
		}
		select {
		case err := <-done:
			t.Fatalf("the blocked change finished (%v) while its nft hung", err)
		default:
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("the blocked change after release: %v", err)
		}
		gone := threeEntries(f)[2].Comment
		if got := nftList(t, ns, "list", "table", string(nftFamily(f)), TableName(blocked.Fix)); strings.Contains(got, gone) {
			t.Errorf("the blocked change (deleting %s) is not in the kernel:\n%s", gone, got)
		}
	})
}
