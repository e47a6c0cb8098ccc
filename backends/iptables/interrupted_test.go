package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// stopAtRestore runs commands through next, but the n-th iptables-restore (1-based) and every one
// after it fail without running, as when the agent is killed between the restores of a split plan.
type stopAtRestore struct {
	next     Runner
	n, count int
}

func (r *stopAtRestore) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	if strings.HasSuffix(name, "-restore") {
		if r.count++; r.count >= r.n {
			return []byte("killed"), errors.New("signal: killed")
		}
	}
	return r.next.Run(ctx, name, args, stdin, stdout)
}

// splitLoad is the External-IP ruleset with n entries from the block base (IPv4: base.x.y; IPv6:
// 2001:db8:<base>::x), large enough that its nat table goes in several restores (plan.chunks).
func splitLoad(f rules.Family, n int, base byte) *rules.Ruleset {
	rs := externalIP(f)
	e := scaleEntries(f, n)
	for i := range e {
		if f == rules.IPv4 {
			b := e[i].Addr.As4()
			b[0], b[1] = 172, base
			e[i].Addr = netip.AddrFrom4(b)
		} else {
			e[i].Addr = netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::%x", base, i+1))
		}
	}
	rs.Maps[0].Entries = e
	return rs
}

// TestKernelInterruptedLoadIsOwned: a cold load split into several restores and stopped after the
// first (the agent killed, a restore failed) leaves chains that no built-in chain jumps to yet. They
// are known to be the fix's through its loading chain, so a cleanup removes every one of them, and
// so does the next apply of the fix, even when it renders other chains; no loading chain outlives a
// load that finishes.
func TestKernelInterruptedLoadIsOwned(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.addForeign()
		before := foreign(k.save())
		rs := splitLoad(k.family, 2*MaxRestoreRules+1, 16)
		p := mustPlan(t, rs)
		if n := len(p.chunks(p.bound(), rs.Fix)); n < 3 {
			t.Fatalf("the load is %d restores, want at least 3 (a split plan)", n)
		}
		interrupt := func() {
			t.Helper()
			b := mustBackend(t, Options{Variant: k.variant, Runner: &stopAtRestore{next: k.run, n: 2}})
			if err := apply(context.Background(), b, rs); err == nil {
				t.Fatal("the apply whose second restore was stopped succeeded")
			}
			s := k.save()
			if !strings.Contains(s, ":"+loadingChain(rs.Fix)+" ") || !strings.Contains(s, ":NNM-") {
				t.Fatalf("after the stopped load the kernel holds no loading chain or no chain of ours:\n%s", s)
			}
			for _, l := range strings.Split(s, "\n") {
				if strings.HasPrefix(l, "-A ") && !strings.HasPrefix(l, "-A NNM-") && strings.Contains(l, jumpCommentPrefix+rs.Fix) {
					t.Fatalf("the stopped load already jumps from a built-in chain: %s", l)
				}
			}
		}

		// A cleanup (deploy/uninstall runs it) after the stopped load.
		interrupt()
		if _, err := opsOf(k.backend()).RemoveAll(context.Background(), k.family); err != nil {
			t.Fatal(err)
		}
		s := k.save()
		mustLack(t, s, "NNM-", jumpCommentPrefix)
		if got := foreign(s); got != before {
			t.Errorf("the cleanup changed what is not ours:\n%s\nwant\n%s", got, before)
		}

		// The next apply, by another process, of other entries (so other bucket chains).
		interrupt()
		next := splitLoad(k.family, 3000, 17)
		b := k.backend()
		mustApply(t, b, next)
		d, err := opsOf(b).save(context.Background(), k.family)
		if err != nil {
			t.Fatal(err)
		}
		owners := d.owners()
		chains := 0
		for _, tb := range d.tables {
			for _, c := range tb.chains {
				if !isOurs(c.name) {
					continue
				}
				chains++
				if isLoading(c.name) {
					t.Errorf("table %s still has the loading chain %s after a load that finished", tb.name, c.name)
				} else if owners[tchain{tb.name, c.name}] != next.Fix {
					t.Errorf("table %s chain %s is left from the stopped load: no jump of the fix reaches it", tb.name, c.name)
				}
			}
		}
		want := len(mustRendering(t, next).set)
		if chains != want {
			t.Errorf("the kernel holds %d chains of ours, the apply renders %d", chains, want)
		}
		if got := foreign(k.save()); got != before {
			t.Errorf("the apply changed what is not ours:\n%s\nwant\n%s", got, before)
		}
	})
}

func mustPlan(t *testing.T, rs *rules.Ruleset) plan {
	t.Helper()
	p, _, _, err := planRuleset(rs)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustRendering(t *testing.T, rs *rules.Ruleset) *rendering {
	t.Helper()
	_, chains, jumps, err := planRuleset(rs)
	if err != nil {
		t.Fatal(err)
	}
	return newRendering(chains, jumps, precedenceOf(rs))
}
