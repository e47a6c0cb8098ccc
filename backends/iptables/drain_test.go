package iptables

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// sampler runs the binaries and, after each iptables-restore, hands the namespace's ruleset to
// check.
type sampler struct {
	Runner
	k        *kernel
	restores int
	check    func(n int, save string)
}

func (s *sampler) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	out, err := s.Runner.Run(ctx, name, args, stdin, stdout)
	if err == nil && strings.HasSuffix(name, "-restore") && s.check != nil {
		s.restores++
		s.check(s.restores, s.k.save())
	}
	return out, err
}

// TestKernelSplitChangeDrainsFirst: a change of entries large enough for several restores, which
// moves a tenant's entries to other addresses (buckets go, others appear) beside entries that stay,
// empties the buckets that go in its first restore (the kernel never holds their rules and their
// replacements' at once), keeps every entry that stays in the kernel after every restore, and ends
// as a reconcile from scratch.
func TestKernelSplitChangeDrainsFirst(t *testing.T) {
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) {
			ctx := context.Background()
			k, scratch := newKernel(t, NFT, f), newKernel(t, NFT, f)
			s := &sampler{Runner: k.run, k: k}
			b := mustBackend(t, Options{Variant: NFT, Runner: s, Generation: k.generation})
			addr := func(block, host int) netip.Addr {
				if f == rules.IPv4 {
					return netip.AddrFrom4([4]byte{198, 18, byte(block), byte(host)})
				}
				return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::%x", block, host))
			}
			to := netip.MustParseAddr(map[rules.Family]string{rules.IPv4: "10.96.0.1", rules.IPv6: "fd00:96::1"}[f])
			var kept, moving, moved []rules.MapEntry
			entries := func(block, hosts, ports int) (out []rules.MapEntry) {
				for h := range hosts {
					for p := range ports {
						out = append(out, rules.MapEntry{Addr: addr(block, h+1), Protocol: rules.TCP, Port: uint16(1000 + p),
							To: netip.AddrPortFrom(to, uint16(1000+p)), Comment: fmt.Sprintf("t/s%d-%d", block, h)})
					}
				}
				return out
			}
			kept = entries(1, 3, 5)
			// Over MaxDrainingRestoreRules (the change drains): externalIPSharded renders 3 rules an entry.
			hosts := 2*MaxDrainingRestoreRules/(25*3) + 1
			moving, moved = entries(2, hosts, 25), entries(3, hosts, 25)
			rs := func(e ...[]rules.MapEntry) *rules.Ruleset {
				r := externalIPSharded(f)
				for _, l := range e {
					r.Maps[0].Entries = append(r.Maps[0].Entries, l...)
				}
				return r
			}
			if err := apply(ctx, b, rs(kept, moving)); err != nil {
				t.Fatal(err)
			}
			// An entry's rules match its address alone (a dispatch rule matches a bucket's prefix).
			has := func(save string, a netip.Addr) bool {
				return strings.Contains(save, fmt.Sprintf(" -d %s/%d ", a, a.BitLen()))
			}
			s.restores = 0
			s.check = func(n int, save string) {
				for _, e := range kept {
					if !has(save, e.Addr) {
						t.Errorf("after restore %d of the change, the entry that stays %s is not in the kernel", n, e.Addr)
						return
					}
				}
				if n == 1 {
					for _, e := range moving {
						if has(save, e.Addr) {
							t.Errorf("after the first restore of the change, the bucket of %s, which goes, still holds its rules", e.Addr)
							return
						}
					}
				}
			}
			if err := apply(ctx, b, rs(kept, moved)); err != nil {
				t.Fatal(err)
			}
			s.check = nil
			if s.restores < 3 {
				t.Fatalf("the change took %d restores, want it split (at least 3)", s.restores)
			}
			if err := apply(ctx, mustBackend(t, Options{Variant: NFT, Runner: scratch.run}), rs(kept, moved)); err != nil {
				t.Fatal(err)
			}
			if got, want := oursUnordered(k.save()), oursUnordered(scratch.save()); got != want {
				t.Fatalf("after the change the kernel differs from a reconcile from scratch:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
