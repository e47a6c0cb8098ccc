package iptables

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/nfgen"
	"github.com/network-node-manager/network-node-manager/internal/testing/insertfirst"
)

// nsRunner runs the binaries inside a test namespace and counts the calls per binary.
type nsRunner struct {
	ns    *netns.NS
	calls testkit.Counts
	// after, when set, is called after each run (with the run's error).
	after func(name string, err error)
}

func (r *nsRunner) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	r.calls.Add(name)
	stderr, err := r.ns.Run(ctx, name, args, stdin, stdout)
	if r.after != nil {
		r.after(name, err)
	}
	return stderr, err
}

// reset returns the calls per binary since the last reset.
func (r *nsRunner) reset() map[string]int { return r.calls.Take() }

// kernel is one namespace, one variant, one family.
type kernel struct {
	t       testing.TB
	ns      *netns.NS
	variant Variant
	family  rules.Family
	run     *nsRunner
}

func (k *kernel) bin(tool string) string {
	base := "iptables"
	if k.family == rules.IPv6 {
		base = "ip6tables"
	}
	if tool == "" {
		return base + "-" + string(k.variant)
	}
	return base + "-" + string(k.variant) + "-" + tool
}

// ipt runs iptables (of the variant and family) in the namespace, failing the test on error.
func (k *kernel) ipt(args ...string) {
	k.t.Helper()
	k.ns.MustExec(append([]string{k.bin(""), "-w", "5"}, args...)...)
}

var counterRe = regexp.MustCompile(`\[\d+:\d+\]`)

// save is iptables-save of the namespace without timestamps and counters.
func (k *kernel) save() string {
	k.t.Helper()
	out := k.ns.MustOutput(k.bin("save"))
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		b.WriteString(counterRe.ReplaceAllString(l, "[0:0]") + "\n")
	}
	return b.String()
}

// foreign is the part of save that is not ours: no NNM- chains, no rule jumping to them.
func foreign(save string) string {
	var b strings.Builder
	for _, l := range strings.Split(save, "\n") {
		if strings.Contains(l, "NNM-") {
			continue
		}
		b.WriteString(l + "\n")
	}
	return b.String()
}

func newKernel(t testing.TB, variant Variant, family rules.Family) *kernel {
	k := &kernel{t: t, variant: variant, family: family}
	netns.Require(t, k.bin(""), k.bin("save"), k.bin("restore"))
	k.ns = netns.New(t, "nnm-ipt")
	k.run = &nsRunner{ns: k.ns}
	return k
}

func (k *kernel) backend() *Backend {
	return mustBackend(k.t, Options{Variant: k.variant, Runner: k.run, Generation: k.generation})
}

// generation reads the nf_tables generation of the test's namespace.
func (k *kernel) generation() (uint32, error) {
	var g uint32
	err := k.ns.Do(func() (err error) { g, err = nfgen.Get(); return err })
	return g, err
}

// addForeign creates what kube-proxy and the predecessor would have: chains and rules we must keep
// (KUBE-SERVICES, a rule in INPUT) and NMANAGER_ chains that Cleanup must remove.
func (k *kernel) addForeign() {
	dst := "192.0.2.99"
	if k.family == rules.IPv6 {
		dst = "2001:db8::99"
	}
	k.ipt("-N", "KUBE-SERVICES")
	k.ipt("-A", "KUBE-SERVICES", "-d", dst, "-p", "tcp", "--dport", "80", "-j", "RETURN")
	k.ipt("-A", "FORWARD", "-j", "KUBE-SERVICES")
	k.ipt("-A", "INPUT", "-p", "tcp", "--dport", "9999", "-m", "comment", "--comment", "foreign rule", "-j", "ACCEPT")
	k.ipt("-t", "nat", "-N", "KUBE-SERVICES")
	k.ipt("-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
	k.addPredecessor()
}

func (k *kernel) addPredecessor() {
	k.ipt("-N", "NMANAGER_DROP_INVALID_INPUT")
	k.ipt("-A", "NMANAGER_DROP_INVALID_INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	k.ipt("-I", "INPUT", "-j", "NMANAGER_DROP_INVALID_INPUT")
	k.ipt("-t", "nat", "-N", "NMANAGER_EXTCLUSTER_PRE")
	k.ipt("-t", "nat", "-N", "NMANAGER_EXTCLUSTER_DNAT")
	k.ipt("-t", "nat", "-A", "NMANAGER_EXTCLUSTER_PRE", "-j", "NMANAGER_EXTCLUSTER_DNAT")
	k.ipt("-t", "nat", "-I", "PREROUTING", "-j", "NMANAGER_EXTCLUSTER_PRE")
}

const probePort = 7777

// loopbackCount counts TCP to probePort in OUTPUT.
func loopbackCount(family rules.Family) *rules.Ruleset {
	return &rules.Ruleset{Fix: "loopback-count", Family: family, Chains: []rules.Chain{{
		Name: "PROBE-OUTPUT", Type: rules.Filter, Hook: rules.Output,
		Rules: []rules.Rule{{Match: rules.Match{Protocol: rules.TCP, DstPort: probePort}, Counter: "probe", Comment: "count probes"}},
	}}}
}

// sendProbe makes one TCP connection over loopback inside the namespace and sends a few bytes.
func (k *kernel) sendProbe() {
	k.t.Helper()
	host := "127.0.0.1"
	if k.family == rules.IPv6 {
		host = "::1"
	}
	addr := net.JoinHostPort(host, fmt.Sprint(probePort))
	err := k.ns.Do(func() error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		done := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			_, err = io.ReadAll(c)
			done <- err
		}()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		if _, err := c.Write([]byte("hello")); err != nil {
			return err
		}
		c.Close()
		return <-done
	})
	if err != nil {
		k.t.Fatalf("probe over loopback: %v", err)
	}
}

func forEachKernel(t *testing.T, fn func(t *testing.T, k *kernel)) {
	for _, v := range []Variant{NFT, Legacy} {
		for _, f := range rules.Families {
			t.Run(string(v)+"-"+string(f), func(t *testing.T) {
				fn(t, newKernel(t, v, f))
			})
		}
	}
}

func mustApply(t *testing.T, b *Backend, rs ...*rules.Ruleset) {
	t.Helper()
	for _, r := range rs {
		if err := apply(context.Background(), b, r); err != nil {
			t.Fatal(err)
		}
	}
}

func mustContain(t *testing.T, save string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(save, l) {
			t.Errorf("kernel lacks %q; iptables-save:\n%s", l, save)
		}
	}
}

func mustLack(t *testing.T, save string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if strings.Contains(save, s) {
			t.Errorf("kernel still has %q; iptables-save:\n%s", s, save)
		}
	}
}

func TestKernelLifecycle(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.addForeign()
		b := k.backend()
		foreign1 := lifecycleApply(t, k, b, []*rules.Ruleset{invalidDrop(k.family), externalIP(k.family), loopbackCount(k.family)})
		lifecycleChange(t, k, b, foreign1)
		lifecycleRemove(t, k, foreign1)
	})
}

// lifecycleApply applies all, re-applies and verifies them unchanged, and reads counters; it returns
// the foreign rules as they stood after the first apply.
func lifecycleApply(t *testing.T, k *kernel, b *Backend, all []*rules.Ruleset) string {
	ctx := context.Background()
	// Apply: one save, one restore, one save per ruleset.
	k.run.reset()
	mustApply(t, b, all...)
	if c := k.run.reset(); c[k.bin("restore")] != 3 || c[k.bin("save")] != 6 {
		t.Errorf("first Apply of 3 rulesets ran %v, want 3 restores and 6 saves", c)
	}
	s1 := k.save()
	mustContain(t, s1,
		`-A INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT`,
		`-A NNM-INVALID-INPUT -m conntrack --ctstate INVALID -m comment --comment "invalid-drop/dropped: drop INVALID so the node sends no RST" -j DROP`,
		`-A PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING`,
		`-A POSTROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-MASQ`,
		`-j MASQUERADE`, `--to-destination`)
	// Our jump is first in INPUT, before the foreign rules.
	if i, j := strings.Index(s1, "-A INPUT -m comment --comment \"network-node-manager:invalid-drop\""), strings.Index(s1, "foreign rule"); i < 0 || j < i {
		t.Errorf("our INPUT jump is not before the foreign rule:\n%s", s1)
	}
	foreign1 := foreign(s1)

	// Re-apply trusting the record: nothing runs, and the kernel is byte-identical.
	mustApply(t, b, all...)
	if c := k.run.reset(); len(c) != 0 {
		t.Errorf("no-op Trust reconcile ran %v, want nothing", c)
	}
	// Verify: iptables-nft proves "unchanged" by the nf_tables generation once each record
	// is stamped with the current one (the first round stamps the fixes applied before the
	// last commit); legacy iptables has no generation and runs iptables-save every time.
	for round := range 2 {
		for _, rs := range all {
			if ok, err := inSync(ctx, b, rs); !ok || err != nil {
				t.Fatalf("%s: in sync = %v, %v", rs.Fix, ok, err)
			}
		}
		c := k.run.reset()
		if c[k.bin("restore")] != 0 {
			t.Errorf("Verify of an unchanged kernel ran %v", c)
		}
		if want := map[Variant]int{NFT: 0, Legacy: len(all)}[k.variant]; round == 1 && c[k.bin("save")] != want {
			t.Errorf("second Verify round ran %d saves (%v), want %d", c[k.bin("save")], c, want)
		}
	}
	if s2 := k.save(); s2 != s1 {
		t.Errorf("re-Apply changed the kernel:\nbefore:\n%s\nafter:\n%s", s1, s2)
	}

	// Counters survive a no-op resync and count real packets.
	k.sendProbe()
	mustApply(t, b, loopbackCount(k.family))
	cs, err := b.Counters(ctx, "loopback-count", k.family)
	if err != nil {
		t.Fatal(err)
	}
	if cs["probe"].Packets < 3 || cs["probe"].Bytes == 0 {
		t.Errorf("counter probe = %+v after a TCP exchange, want at least 3 packets", cs["probe"])
	}
	if cs, _ := b.Counters(ctx, "invalid-drop", k.family); len(cs) != 1 || cs["dropped"].Packets != 0 {
		t.Errorf("invalid-drop counters = %v, want dropped=0", cs)
	}

	return foreign1
}

// lifecycleChange changes one fix and tampers with another: only our chains are rewritten, and what
// was changed behind our back is restored.
func lifecycleChange(t *testing.T, k *kernel, b *Backend, foreign1 string) {
	ctx := context.Background()
	// A change rewrites only our chains: one chain and one map entry fewer.
	changed := externalIP(k.family)
	changed.Chains = append(changed.Chains[:1], changed.Chains[2:]...) // without EXTIP-OUTPUT
	removedEntry := changed.Maps[0].Entries[0].Comment
	changed.Maps[0].Entries = changed.Maps[0].Entries[1:]
	k.run.reset()
	mustApply(t, b, changed)
	if c := k.run.reset(); c[k.bin("restore")] != 1 || c[k.bin("save")] != 2 {
		t.Errorf("changing Apply ran %v, want 1 restore and 2 saves", c)
	}
	s3 := k.save()
	mustLack(t, s3, "NNM-EXTIP-OUTPUT", removedEntry)
	mustContain(t, s3, ":NNM-EXTIP-DNAT", ":NNM-INVALID-INPUT")
	if f := foreign(s3); f != foreign1 {
		t.Errorf("a change touched foreign rules:\nbefore:\n%s\nafter:\n%s", foreign1, f)
	}
	if got, want := strings.Count(s3, "-j DNAT"), len(changed.Maps[0].Entries); got != want {
		t.Errorf("%d DNAT rules after the change, want %d", got, want)
	}

	// A rule deleted behind our back is noticed and restored; so is a deleted jump.
	for _, tamper := range [][]string{
		{"-D", "NNM-INVALID-INPUT", "1"},
		{"-D", "INPUT", "-m", "comment", "--comment", "network-node-manager:invalid-drop", "-j", "NNM-INVALID-INPUT"},
		{"-A", "NNM-INVALID-INPUT", "-j", "ACCEPT"},
	} {
		k.ipt(tamper...)
		if ok, err := inSync(ctx, b, invalidDrop(k.family)); err != nil || ok {
			t.Errorf("Verify after %v found it in sync (%v, %v); want a repair", tamper, ok, err)
		}
		if ok, err := inSync(ctx, b, invalidDrop(k.family)); err != nil || !ok {
			t.Errorf("in sync after the repair = %v, %v; want true", ok, err)
		}
		if s := k.save(); s != s3 {
			t.Errorf("re-Apply after %v did not restore the rules:\nwant:\n%s\ngot:\n%s", tamper, s3, s)
		}
	}

}

// lifecycleRemove: a new process removes one fix from what the kernel says, plans the cleanup, and
// cleans up ours and the predecessor's chains, keeping the foreign ones.
func lifecycleRemove(t *testing.T, k *kernel, foreign1 string) {
	ctx := context.Background()
	// A new process knows nothing: Remove finds the fix's chains from the kernel, and only them.
	b2 := k.backend()
	if err := remove(ctx, b2, "ipvs-externalip-dnat", k.family); err != nil {
		t.Fatal(err)
	}
	s4 := k.save()
	mustLack(t, s4, "NNM-EXTIP", "ipvs-externalip-dnat")
	mustContain(t, s4, ":NNM-INVALID-INPUT", ":NNM-PROBE-OUTPUT", "network-node-manager:invalid-drop")
	if f := foreign(s4); f != foreign1 {
		t.Errorf("Remove touched foreign rules:\nbefore:\n%s\nafter:\n%s", foreign1, f)
	}
	if err := remove(ctx, b2, "ipvs-externalip-dnat", k.family); err != nil {
		t.Errorf("removing what is gone: %v", err)
	}

	// CleanupPlan (cleanup --dry-run) names ours and the predecessor's chains and changes nothing.
	before := k.save()
	plan, err := opsOf(b2).CleanupPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	planText := strings.Join(plan, "\n")
	for _, c := range []string{"chain NNM-INVALID-INPUT ", "chain NMANAGER_"} {
		if !strings.Contains(planText, c) {
			t.Errorf("CleanupPlan lacks %q:\n%s", c, planText)
		}
	}
	if strings.Contains(planText, "KUBE-") {
		t.Errorf("CleanupPlan names foreign chains:\n%s", planText)
	}
	if after := k.save(); after != before {
		t.Errorf("CleanupPlan changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Cleanup removes ours and the predecessor's, keeps the foreign.
	if err := b2.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	s5 := k.save()
	mustLack(t, s5, "NNM-", "NMANAGER_", "network-node-manager")
	mustContain(t, s5, ":KUBE-SERVICES", "-A FORWARD -j KUBE-SERVICES", "foreign rule", "kubernetes service portals")
	var wantForeign strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(foreign1), "\n") {
		if !strings.Contains(l, "NMANAGER_") {
			wantForeign.WriteString(l + "\n")
		}
	}
	if s5 != wantForeign.String() {
		t.Errorf("after Cleanup:\nwant:\n%s\ngot:\n%s", wantForeign.String(), s5)
	}
}

// TestKernelRejectKeepsPrevious: a ruleset the kernel rejects (DNAT in POSTROUTING passes Validate but
// not the kernel) returns an error naming the cause and leaves the previous rules in place.
func TestKernelRejectKeepsPrevious(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		b := k.backend()
		mustApply(t, b, externalIP(k.family))
		before := k.save()
		bad := externalIP(k.family)
		bad.Chains[3].Rules = append(bad.Chains[3].Rules, rules.Rule{
			Match:   rules.Match{Protocol: rules.TCP, DstPort: 1},
			Verdict: rules.Verdict{Kind: rules.DNAT, To: netip.AddrPortFrom(bad.Maps[0].Entries[0].To.Addr(), 2)},
		})
		bad.Chains = bad.Chains[2:] // also drop two chains, which must survive the failure
		err := apply(context.Background(), b, bad)
		if err == nil {
			t.Fatalf("Apply of a DNAT in POSTROUTING succeeded:\n%s", k.save())
		}
		t.Logf("error: %v", err)
		// The engine names the fix and family, once; the backend names the tool and its input.
		if !strings.Contains(err.Error(), k.bin("restore")) || strings.HasPrefix(err.Error(), "fix ") {
			t.Errorf("error %q does not name the tool, or names the fix (the engine's prefix)", err)
		}
		if after := k.save(); after != before {
			t.Errorf("failed Apply changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if ok, err := inSync(context.Background(), b, externalIP(k.family)); !ok || err != nil {
			t.Errorf("in sync after a failed Apply = %v, %v; want the previous state still in sync", ok, err)
		}
	})
}

// TestKernelAcceptsGoldens: the kernel takes every golden rendering as it is.
func TestKernelAcceptsGoldens(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		b := k.backend()
		for _, rs := range []*rules.Ruleset{invalidDrop(k.family), externalIP(k.family), kitchenSink(k.family), mssClamp(k.family)} {
			mustApply(t, b, rs)
			if ok, err := inSync(context.Background(), b, rs); !ok || err != nil {
				t.Errorf("%s: in sync = %v, %v", rs.Fix, ok, err)
			}
		}
		// Comments with quotes and backslashes come back from iptables-save as they were.
		mustContain(t, k.save(), `--comment "kitchen-sink: it\'s \"quoted\" \\ and tabbed"`)
	})
}

// TestCleanupPredecessorOnly removes NMANAGER_ chains and keeps ours.
func TestCleanupPredecessorOnly(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.addPredecessor()
		b := k.backend()
		mustApply(t, b, invalidDrop(k.family))
		n, err := opsOf(b).CleanupPredecessor(context.Background(), k.family, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Error("CleanupPredecessor reported no chain removed")
		}
		s := k.save()
		mustLack(t, s, "NMANAGER_")
		mustContain(t, s, ":NNM-INVALID-INPUT", "network-node-manager:invalid-drop")
		if ok, _ := inSync(context.Background(), b, invalidDrop(k.family)); !ok {
			t.Error("CleanupPredecessor disturbed our chains")
		}
	})
}

// RemoveAll (what a run with the nftables backend removes of an earlier iptables run) takes every
// NNM- chain of the family, in every table, and the jumps to them; the predecessor's chains and
// foreign rules stay.
func TestKernelRemoveAll(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.addForeign() // kube-proxy's chains and the predecessor's NMANAGER_ chains
		b := k.backend()
		mustApply(t, b, invalidDrop(k.family), externalIP(k.family))
		before := foreign(k.save())
		n, err := opsOf(k.backend()).RemoveAll(context.Background(), k.family) // a fresh process
		if err != nil {
			t.Fatal(err)
		}
		s := k.save()
		mustLack(t, s, "NNM-", "network-node-manager:")
		mustContain(t, s, "NMANAGER_", "KUBE-SERVICES")
		if after := foreign(s); after != before {
			t.Fatalf("RemoveAll changed foreign rules (-before +after):\n%s", lineDiffs(before, after))
		}
		if n < 5 {
			t.Fatalf("RemoveAll reported %d chains, want ≥ 5 (4 hooked chains, the DNAT chain, its buckets)", n)
		}
		if n, err := opsOf(k.backend()).RemoveAll(context.Background(), k.family); err != nil || n != 0 {
			t.Fatalf("a second RemoveAll: %d, %v; want 0, nil", n, err)
		}
	})
}

// TestKernelScale applies 1,000 services (2,000 expanded rules) and checks the exec count stays constant.
func TestKernelScale(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test skipped in -short")
	}
	for _, v := range []Variant{NFT, Legacy} {
		t.Run(string(v), func(t *testing.T) {
			k := newKernel(t, v, rules.IPv4)
			b := k.backend()
			rs := externalIP(rules.IPv4)
			var entries []rules.MapEntry
			for i := range 1000 {
				a := netip.AddrFrom4([4]byte{198, 18, byte(i / 250), byte(i%250 + 1)})
				to := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})
				entries = append(entries, rules.MapEntry{Addr: a, Protocol: rules.TCP, Port: 443, To: netip.AddrPortFrom(to, 443), Comment: fmt.Sprintf("ns/svc-%d:https", i)})
			}
			rs.Maps[0].Entries = entries
			k.run.reset()
			start := time.Now()
			mustApply(t, b, rs)
			first := time.Since(start)
			if c := k.run.reset(); c[k.bin("restore")] != 1 || c[k.bin("save")] != 2 {
				t.Errorf("Apply of 1000 entries ran %v, want 1 restore and 2 saves", c)
			}
			start = time.Now()
			mustApply(t, b, rs)
			noop := time.Since(start)
			rs.Maps[0].Entries = entries[1:]
			start = time.Now()
			mustApply(t, b, rs)
			change := time.Since(start)
			// The no-op (Trust) runs nothing; the change rewrites one bucket and lists it.
			if c := k.run.reset(); c[k.bin("restore")] != 1 || c[k.bin("save")] != 0 || c[k.bin("")] != 1 {
				t.Errorf("no-op + change ran %v, want 1 restore, no save and 1 listing", c)
			}
			if ok, err := inSync(context.Background(), b, rs); err != nil || !ok {
				t.Errorf("in sync after the change = %v, %v; want true", ok, err)
			}
			if n := strings.Count(k.save(), "-j DNAT"); n != 999 {
				t.Errorf("%d DNAT rules in the kernel, want 999", n)
			}
			t.Logf("%s, 1000 entries (%d kernel rules in 4 buckets): first Apply %v, no-op Apply %v, change of one entry %v",
				v, 2*1000+5+4, first.Round(time.Millisecond), noop.Round(time.Millisecond), change.Round(time.Millisecond))
		})
	}
}

// TestKernelJumpStaysFirst: when another component inserts its rule at the top of a built-in chain
// (kube-proxy re-inserting its KUBE-SERVICES jump in nat PREROUTING after a restart would bypass our
// DNAT), InSync reports it and Apply moves our jump back ahead of it, leaving the foreign rule alone.
// TestKernelPositionPolicy: foreign rules inserted ahead of our jumps are no drift (no repair, nothing
// moved); a jump to a chain ours must precede (KUBE-SERVICES, Chain.Precedes) ahead of ours is, and
// so is our jump altered or gone.
func TestKernelPositionPolicy(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		b := k.backend()
		dnat, drop := externalIP(k.family), invalidDrop(k.family)
		mustApply(t, b, dnat, drop)
		syncs := func(want bool, when string) {
			t.Helper()
			for _, rs := range []*rules.Ruleset{dnat, drop} {
				if in, err := inSync(ctx, b, rs); err != nil || in != want {
					t.Fatalf("%s: %s in sync = %v (%v), want %v; iptables-save:\n%s", when, rs.Fix, in, err, want, k.save())
				}
			}
		}
		// Another agent inserts its own jumps first, in both our tables.
		k.ipt("-N", "cali-INPUT")
		k.ipt("-A", "cali-INPUT", "-j", "ACCEPT")
		k.ipt("-I", "INPUT", "1", "-j", "cali-INPUT")
		k.ipt("-t", "nat", "-N", "cali-PREROUTING")
		k.ipt("-t", "nat", "-I", "PREROUTING", "1", "-j", "cali-PREROUTING")
		before := k.save()
		syncs(true, "foreign jumps inserted ahead of ours")
		if after := k.save(); after != before {
			t.Fatalf("a Verify changed the kernel although only foreign jumps came first (-before +after):\n%s", lineDiffs(before, after))
		}
		first := func(chain, table, want string) {
			t.Helper()
			out := k.ns.MustExec(k.bin(""), "-w", "5", "-t", table, "-S", chain)
			var rules []string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "-A ") {
					rules = append(rules, l)
				}
			}
			if len(rules) == 0 || !strings.Contains(rules[0], want) {
				t.Fatalf("%s %s: first rule is not %q:\n%s", table, chain, want, out)
			}
		}
		first("INPUT", "filter", "-j cali-INPUT")
		first("PREROUTING", "nat", "-j cali-PREROUTING")

		// kube-proxy's KUBE-SERVICES ahead of our DNAT would ACCEPT LoadBalancer traffic first.
		k.ipt("-t", "nat", "-N", "KUBE-SERVICES")
		k.ipt("-t", "nat", "-I", "PREROUTING", "1", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
		if in, err := inSync(ctx, b, dnat); err != nil || in {
			t.Fatalf("Verify found the DNAT in sync (%v, %v) behind KUBE-SERVICES; want a repair", in, err)
		}
		s := k.save()
		ours := strings.Index(s, `-A PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING`)
		theirs := strings.Index(s, `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		if ours < 0 || theirs < 0 || ours > theirs {
			t.Fatalf("our jump is not back ahead of KUBE-SERVICES (ours at %d, theirs at %d):\n%s", ours, theirs, s)
		}
		if n := strings.Count(s, `"network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING`); n != 1 {
			t.Fatalf("want exactly one PREROUTING jump, found %d:\n%s", n, s)
		}
		syncs(true, "after the move ahead of KUBE-SERVICES")

		// Our jump altered (a match added, same comment and target): repaired to the exact rule.
		k.ipt("-D", "INPUT", "-m", "comment", "--comment", "network-node-manager:invalid-drop", "-j", "NNM-INVALID-INPUT")
		k.ipt("-A", "INPUT", "-i", "lo", "-m", "comment", "--comment", "network-node-manager:invalid-drop", "-j", "NNM-INVALID-INPUT")
		if in, err := inSync(ctx, b, drop); err != nil || in {
			t.Fatalf("Verify found an altered jump in sync (%v, %v); want a repair", in, err)
		}
		s = k.save()
		mustContain(t, s, `-A INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT`)
		mustLack(t, s, `-i lo -m comment --comment "network-node-manager:invalid-drop"`)
		first("INPUT", "filter", `--comment "network-node-manager:invalid-drop"`)
		syncs(true, "after the altered jump was repaired")
	})
}

// TestKernelInsertFirstNeighbour runs an insert-first agent (internal/testing/insertfirst, Felix's default
// insert mode) beside the backend's periodic Verify: the agent moves its jumps ahead of ours once,
// after which neither side moves anything, Verify repairs nothing, and the order stays.
func TestKernelInsertFirstNeighbour(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		b := k.backend()
		dnat, drop := externalIP(k.family), invalidDrop(k.family)
		bin := map[rules.Family]string{rules.IPv4: "iptables", rules.IPv6: "ip6tables"}[k.family]
		mustApply(t, b, dnat, drop) // ours first at the top; the agent then takes position 1
		agent, err := insertfirst.Start(ctx, insertfirst.Options{Netns: k.ns.Name, Variant: string(k.variant),
			Binaries: []string{bin}, Jumps: insertfirst.Calico, Period: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer agent.Stop()
		settled := k.save()
		repairs := 0
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			for _, rs := range []*rules.Ruleset{dnat, drop} {
				res, err := verify(ctx, b, rs)
				if err != nil {
					t.Fatal(err)
				}
				if res.Repaired {
					repairs++
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := agent.Stop(); err != nil {
			t.Fatal(err)
		}
		moves, rounds := agent.Reinserts()
		after := k.save()
		t.Logf("%d Verify repairs; the agent moved its jumps %d times in %d rounds", repairs, moves, rounds)
		if repairs != 0 {
			t.Errorf("Verify repaired %d times beside an insert-first agent; want 0", repairs)
		}
		if moves != 0 || rounds == 0 {
			t.Errorf("the agent moved its jumps %d times in %d rounds after it took the top; want 0 in ≥ 1", moves, rounds)
		}
		if after != settled {
			t.Errorf("the ruleset changed while both ran (-settled +after):\n%s", lineDiffs(settled, after))
		}
		for _, j := range insertfirst.Calico {
			mustContain(t, after, "-A "+j.Chain+" -j "+j.Target)
		}
		mustContain(t, after, `"network-node-manager:invalid-drop" -j NNM-INVALID-INPUT`, `"network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING`)
	})
}

// TestKernelTableMove: a hooked chain that moves to another table (invalid-drop from filter to
// mangle, issue #20) is created there and the old chain and its jump go in the same reconcile, also
// from a fresh process that knows the old chain only from the kernel.
func TestKernelTableMove(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		old := invalidDrop(k.family)
		mustApply(t, k.backend(), old)
		moved := old.Clone()
		moved.Chains[0].Type = rules.Mangle
		b := k.backend() // a new process: no record of the filter chain
		mustApply(t, b, moved)
		s := k.save()
		mangle := s[strings.Index(s, "*mangle"):]
		mangle = mangle[:strings.Index(mangle, "COMMIT")]
		mustContain(t, mangle, ":NNM-INVALID-INPUT", `-A INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT`, "--ctstate INVALID")
		if strings.Count(s, ":NNM-INVALID-INPUT") != 1 || strings.Count(s, "-j NNM-INVALID-INPUT") != 1 {
			t.Fatalf("the filter chain or its jump is still there:\n%s", s)
		}
		if in, err := inSync(ctx, b, moved); err != nil || !in {
			t.Fatalf("in sync = %v, %v after the move; want true", in, err)
		}
	})
}

// lineDiffs is the line-by-line difference of two dumps (-before +after), moved lines included.
func lineDiffs(before, after string) string {
	return cmp.Diff(strings.Split(before, "\n"), strings.Split(after, "\n"))
}

func TestKernelBuckets(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		// The node's own address 10.99.0.1 / fd00:99::1 on one end of a veth pair (this kernel has no
		// dummy links); the External-IPs are routed out of it, so a connection to them reaches a
		// listener only if our DNAT rewrote it.
		local, route, ips := "10.99.0.1", "203.0.113.0/24", []string{"203.0.113.5", "198.51.100.7"}
		if k.family == rules.IPv6 {
			local, route, ips = "fd00:99::1", "2001:db8:ff::/64", []string{"2001:db8:ff::10", "2001:db8:ff::1:5"}
		}
		k.ns.MustExec("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
		k.ns.MustExec("ip", "link", "set", "d1", "up")
		k.ns.MustExec("ip", "link", "set", "d0", "up")
		if k.family == rules.IPv6 {
			k.ns.MustExec("ip", "addr", "add", local+"/64", "dev", "d0", "nodad")
		} else {
			k.ns.MustExec("ip", "addr", "add", local+"/24", "dev", "d0")
		}
		k.ns.MustExec("ip", "route", "add", route, "dev", "d0")
		if k.family == rules.IPv4 {
			k.ns.MustExec("ip", "route", "add", "198.51.100.0/24", "dev", "d0")
		}
		ports := []uint16{7781, 7782}
		entries := func(single bool, is ...int) *rules.Ruleset {
			return bucketsRuleset(k.family, local, ips, ports, single, is)
		}
		rs := func(is ...int) *rules.Ruleset { return entries(false, is...) }
		b := k.backend()
		mustApply(t, b, rs(0, 1))
		buckets := []string{bucketName("EXTIP-DNAT", 1, bucketPrefix(netip.MustParseAddr(ips[0]))), bucketName("EXTIP-DNAT", 1, bucketPrefix(netip.MustParseAddr(ips[1])))}
		if buckets[0] == buckets[1] {
			t.Fatalf("the test addresses share the bucket %s", buckets[0])
		}
		mustContain(t, k.save(), ":"+buckets[0], ":"+buckets[1], "-j "+buckets[0], "-j "+buckets[1])

		for i := range ips {
			if got := k.connect(ips[i], ports); got != ports[i] {
				t.Errorf("connection to %s:80 reached port %d, want %d", ips[i], got, ports[i])
			}
		}
		cs, err := b.Counters(ctx, "ipvs-externalip-dnat", k.family)
		if err != nil {
			t.Fatal(err)
		}
		if cs["dnat"].Packets != 2 {
			t.Errorf("counter dnat = %+v after two connections, want 2 packets", cs["dnat"])
		}

		// One entry changes: one restore and a listing of its bucket, no iptables-save.
		changed := rs(0, 1)
		changed.Maps[0].Entries[2].Comment = "ns/svc-1:renamed"
		k.applyOneEntryChange(t, b, changed, "a one-entry change")
		if ok, err := inSync(ctx, b, changed); err != nil || !ok {
			t.Errorf("in sync after a bucket rewrite = %v, %v; want true", ok, err)
		}
		mustContain(t, k.save(), "ns/svc-1:renamed")

		// The bucket of entry 1 empties: it is deleted with its dispatch rule.
		mustApply(t, b, rs(0))
		s := k.save()
		mustLack(t, s, buckets[1])
		mustContain(t, s, ":"+buckets[0])
		if ok, err := inSync(ctx, b, rs(0)); err != nil || !ok {
			t.Errorf("in sync after a bucket removal = %v, %v; want true", ok, err)
		}
		if got := k.connect(ips[0], ports); got != ports[0] {
			t.Errorf("after the removal, connection to %s:80 reached port %d, want %d", ips[0], got, ports[0])
		}

		// A rule deleted inside a bucket: Verify notices and restores it.
		k.ipt("-t", "nat", "-D", buckets[0], "1")
		if ok, err := inSync(ctx, b, rs(0)); err != nil || ok {
			t.Errorf("Verify after deleting a rule in a bucket found it in sync (%v, %v)", ok, err)
		}
		if after := k.save(); after != s {
			t.Errorf("Apply did not restore the bucket:\nwant:\n%s\ngot:\n%s", s, after)
		}

		kernelInlinedBuckets(t, k, func(is ...int) *rules.Ruleset { return entries(true, is...) }, ips, ports, buckets)

		// A fresh process's Remove finds the buckets through the dispatch rules.
		if err := remove(ctx, k.backend(), "ipvs-externalip-dnat", k.family); err != nil {
			t.Fatal(err)
		}
		mustLack(t, k.save(), "NNM-")
	})
}

// applyOneEntryChange applies changed, a change of one entry, with b and checks that it took one
// restore and one listing, and no iptables-save (what names the change in the error).
func (k *kernel) applyOneEntryChange(t *testing.T, b *Backend, changed *rules.Ruleset, what string) {
	t.Helper()
	k.run.reset()
	mustApply(t, b, changed)
	if c := k.run.reset(); c[k.bin("restore")] != 1 || c[k.bin("save")] != 0 || c[k.bin("")] != 1 {
		t.Errorf("%s ran %v, want 1 restore, 1 listing and no save", what, c)
	}
}

// bucketsRuleset is the DNAT fix's chains without the masquerade (the connections stay on the
// node) with entries for the External-IPs ips[i] of is, to local:ports[i]: single, one entry (port
// 80) an External-IP, so one rule a bucket, inlined; else also port 8080, and each bucket is a
// chain of its own.
func bucketsRuleset(f rules.Family, local string, ips []string, ports []uint16, single bool, is []int) *rules.Ruleset {
	r := externalIP(f)
	r.Chains = r.Chains[:3]
	r.Maps[0].Entries = nil
	for _, i := range is {
		for _, port := range []uint16{80, 8080} {
			if port != 80 && single {
				continue
			}
			r.Maps[0].Entries = append(r.Maps[0].Entries, rules.MapEntry{
				Addr: netip.MustParseAddr(ips[i]), Protocol: rules.TCP, Port: port,
				To: netip.AddrPortFrom(netip.MustParseAddr(local), ports[i]), Comment: fmt.Sprintf("ns/svc-%d:%d", i, port)})
		}
	}
	return r
}

// kernelInlinedBuckets: with one entry an External-IP, each bucket's one rule stands in the chain
// that lists it (the bucket chains go); connections still reach their entry's port; a change of one
// such entry is one restore and a listing, no save; Verify notices an inlined rule deleted.
func kernelInlinedBuckets(t *testing.T, k *kernel, rs func(...int) *rules.Ruleset, ips []string, ports []uint16, buckets []string) {
	ctx := context.Background()
	b := k.backend()
	mustApply(t, b, rs(0, 1))
	s := k.save()
	mustLack(t, s, buckets[0], buckets[1])
	for i := range ips {
		mustContain(t, s, "-A NNM-EXTIP-DNAT -d "+netip.PrefixFrom(netip.MustParseAddr(ips[i]), netip.MustParseAddr(ips[i]).BitLen()).String())
		if got := k.connect(ips[i], ports); got != ports[i] {
			t.Errorf("inlined: connection to %s:80 reached port %d, want %d", ips[i], got, ports[i])
		}
	}
	changed := rs(0, 1)
	changed.Maps[0].Entries[1].Comment = "ns/svc-1:inlined"
	k.applyOneEntryChange(t, b, changed, "a one-entry change of an inlined bucket")
	mustContain(t, k.save(), "ns/svc-1:inlined")
	k.ipt("-t", "nat", "-D", "NNM-EXTIP-DNAT", "2")
	if ok, err := inSync(ctx, b, changed); err != nil || ok {
		t.Errorf("Verify after deleting an inlined rule found it in sync (%v, %v)", ok, err)
	}
	if ok, err := inSync(ctx, b, changed); err != nil || !ok {
		t.Errorf("in sync after Verify restored the inlined rule = %v, %v; want true", ok, err)
	}
}

// connect listens on every port of ports at the node's address (all addresses), dials addr:80 from
// inside the namespace, and returns the port whose listener accepted the connection (0 if none).
func (k *kernel) connect(addr string, ports []uint16) uint16 {
	k.t.Helper()
	var got uint16
	err := k.ns.Do(func() error {
		accepted := make(chan uint16, len(ports))
		for _, p := range ports {
			ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				accepted <- p
			}()
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "80"), 3*time.Second)
		if err != nil {
			return err
		}
		c.Close()
		select {
		case got = <-accepted:
		case <-time.After(10 * time.Second): // the dial succeeded: only a starved Accept goroutine is slower
		}
		return nil
	})
	if err != nil {
		k.t.Errorf("connecting to %s:80: %v", addr, err)
	}
	return got
}

// TestKernelFirstInsertLeavesForeignJumpsFirst: a missing jump whose chain must precede foreign
// chains (the DNAT's KUBE-SERVICES) is inserted directly ahead of the first of them, behind other
// agents' jumps, or at the end of the built-in chain when none is there, so an insert-first agent
// (Felix) finds its jumps still first and moves nothing, also at the agent's first apply.
func TestKernelFirstInsertLeavesForeignJumpsFirst(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		order := func(chain string) []string {
			t.Helper()
			var got []string
			for _, l := range strings.Split(k.ns.MustExec(k.bin(""), "-w", "5", "-t", "nat", "-S", chain), "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == "-A" {
					got = append(got, f[len(f)-1])
				}
			}
			return got
		}
		k.ipt("-t", "nat", "-N", "cali-PREROUTING")
		k.ipt("-t", "nat", "-N", "cali-OUTPUT")
		k.ipt("-t", "nat", "-N", "KUBE-SERVICES")
		k.ipt("-t", "nat", "-I", "PREROUTING", "1", "-j", "cali-PREROUTING")
		k.ipt("-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")
		k.ipt("-t", "nat", "-I", "OUTPUT", "1", "-j", "cali-OUTPUT")
		mustApply(t, k.backend(), externalIP(k.family))
		if got, want := order("PREROUTING"), []string{"cali-PREROUTING", "NNM-EXTIP-PREROUTING", "KUBE-SERVICES"}; !slices.Equal(got, want) {
			t.Errorf("nat PREROUTING jumps = %v, want %v", got, want)
		}
		if got := order("OUTPUT"); len(got) != 2 || got[0] != "cali-OUTPUT" {
			t.Errorf("nat OUTPUT jumps = %v, want cali-OUTPUT first, then ours", got)
		}
	})
}

// TestKernelInterferenceBeforeReadBack: someone else changes our rules right after our restore,
// before the backend reads the kernel back for its record (the e2e flush scenario once landed
// there). The read-back must not become the record: Verify would then find the damage matching and
// leave it. The Driver applies again, and the kernel holds the rules.
func TestKernelInterferenceBeforeReadBack(t *testing.T) {
	forEachKernel(t, func(t *testing.T, k *kernel) {
		ctx := context.Background()
		b := k.backend()
		chain := KernelChain("PROBE-OUTPUT")
		jump := []string{"-D", "OUTPUT", "-m", "comment", "--comment", jumpCommentPrefix + "loopback-count", "-j", chain}
		// interfere runs cmd once, right after the next successful restore.
		interfere := func(cmd ...string) {
			k.run.after = func(name string, err error) {
				if err == nil && name == k.bin("restore") {
					k.run.after = nil
					k.ipt(cmd...)
				}
			}
		}
		check := func(what, rule string, rs *rules.Ruleset) {
			t.Helper()
			if k.run.after != nil {
				t.Fatalf("%s: no restore ran", what)
			}
			mustContain(t, k.save(), "-A OUTPUT -m comment --comment \"network-node-manager:loopback-count\" -j "+chain, rule)
			k.ipt("-N", "FOREIGN-"+rule[len(rule)-4:]) // an unrelated commit: Verify reads the kernel
			if res, err := verify(ctx, b, rs); err != nil || res.Repaired {
				t.Fatalf("%s: Verify found %+v, %v; want the record true to the kernel", what, res, err)
			}
		}
		rs := loopbackCount(k.family)
		interfere(jump...)
		mustApply(t, b, rs)
		check("the jump deleted after the first apply", "--dport 7777", rs)

		// A change of the chain's rules alone goes the short way (rewrite the chain, list it).
		rs2 := loopbackCount(k.family)
		rs2.Chains[0].Rules[0].Match.DstPort = probePort + 1
		interfere("-F", chain)
		mustApply(t, b, rs2)
		check("the chain flushed after its rewrite", "--dport 7778", rs2)
	})
}
