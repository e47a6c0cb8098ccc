package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestKernelIncrementalEqualsScratch: a random sequence of map changes (entries added, removed and
// re-pointed, buckets filled and emptied), reconciled one after another, leaves our chains in the
// kernel exactly as reconciling each step's ruleset without a record does (a fresh backend in a
// second namespace), and the record stays true: each Verify after a change finds nothing to repair
// or send. Two ways of knowing the kernel: without a generation (every Verify reads the kernel back,
// and a bucket that changes is always rewritten: no change is built on positions the backend has
// not seen), and, with iptables-nft, the namespace's nf_tables generation (buckets are edited in
// place, and some steps must have been).
func TestKernelIncrementalEqualsScratch(t *testing.T) {
	for _, v := range []Variant{NFT, Legacy} {
		for _, f := range rules.Families {
			for _, gen := range []bool{false, true} {
				if gen && v == Legacy {
					continue // legacy iptables has no generation
				}
				name := string(v) + "-" + string(f) + map[bool]string{false: "", true: "-generation"}[gen]
				t.Run(name, func(t *testing.T) { incrementalEqualsScratch(t, v, f, gen, 4) })
			}
		}
	}
}

// TestKernelIncrementalTreeEqualsScratch is TestKernelIncrementalEqualsScratch over 48 buckets
// instead of 4, so that the dispatch is a tree (more than dispatchLeaf buckets) whose nodes appear
// and go as buckets fill and empty: a change that adds or removes a bucket rewrites the dispatch
// from the new ruleset alone and takes the chains that go from the record (staleChains).
func TestKernelIncrementalTreeEqualsScratch(t *testing.T) {
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) { incrementalEqualsScratch(t, NFT, f, true, 48) })
	}
}

// incrementalEqualsScratch runs 40 random changes (or more, up to 200, until the variant's paths
// were taken) of entries spread over buckets buckets (see TestKernelIncrementalEqualsScratch).
func incrementalEqualsScratch(t *testing.T, v Variant, f rules.Family, gen bool, buckets int) {
	ctx := context.Background()
	inc, scratch := newKernel(t, v, f), newKernel(t, v, f)
	rec := &restoreRecorder{Runner: inc.run}
	opts := Options{Variant: v, Runner: rec, Generation: func() (uint32, error) {
		return 0, errors.New("no generation: Verify reads the kernel")
	}}
	if gen {
		opts.Generation = inc.generation
	}
	b := mustBackend(t, opts)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	var entries []rules.MapEntry
	edited, appended, inserted, nodesIn, nodesOut := 0, 0, 0, 0, 0
	// What the variant must have taken: a walk of 40 steps (a seed) may not have, e.g. one whose
	// every step fills or empties a bucket edits none in place; it goes on until it has, up to 200.
	// Over a tree, a random walk mostly grows (adds outweigh removals), so past 40 steps it is
	// steered: it empties buckets until a dispatch node has gone, after growing one if none was.
	covered := func() bool {
		switch {
		case buckets > dispatchLeaf:
			return nodesIn > 0 && nodesOut > 0
		case gen:
			return edited > 0 && appended > 0 && inserted > 0
		}
		return true
	}
	steps := 0
	for step := 0; step < 40 || step < 200 && !covered(); step++ {
		steps++
		steer := 0
		if step >= 40 && buckets > dispatchLeaf {
			steer = map[bool]int{false: grow, true: shrink}[nodesIn > 0]
		}
		entries = mutateEntries(rnd, f, entries, buckets, steer)
		// Two runs of lookups on one map: one DNAT rule (unordered buckets), and a MARK and a DNAT
		// rule (ordered buckets: every MARK rule ahead of every DNAT rule).
		rs := externalIPSharded(f)
		rs.Maps[0].Entries = entries
		rec.inputs = nil
		if err := apply(ctx, b, rs); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for _, in := range rec.inputs {
			nodesIn += len(treeNode.FindAllString(in, -1))
			nodesOut += len(treeNodeGone.FindAllString(in, -1))
			if strings.Contains(in, "\n:NNM-") { // chains declared: rewritten, not edited
				continue
			}
			a, i := strings.Contains(in, "\n-A NNM-"), strings.Contains(in, "\n-I NNM-")
			if a || i || strings.Contains(in, "\n-D NNM-") {
				edited++
			}
			if a {
				appended++
			}
			if i {
				inserted++
			}
		}
		res, err := verify(ctx, b, rs)
		if err != nil || res.Repaired || res.Applied {
			t.Fatalf("step %d: Verify after the change = %+v, %v; the record does not match the kernel", step, res, err)
		}
		fresh := mustBackend(t, Options{Variant: v, Runner: scratch.run})
		if err := apply(ctx, fresh, rs); err != nil {
			t.Fatalf("step %d: from scratch: %v", step, err)
		}
		if got, want := oursUnordered(inc.save()), oursUnordered(scratch.save()); got != want {
			t.Fatalf("step %d (%d entries): incremental kernel state differs from a reconcile from scratch:\n%s\nwant:\n%s", step, len(entries), got, want)
		}
	}
	if buckets > dispatchLeaf && (nodesIn == 0 || nodesOut == 0) {
		t.Errorf("over %d buckets, %d dispatch nodes were declared and %d removed: want some of each", buckets, nodesIn, nodesOut)
	}
	switch {
	case buckets > dispatchLeaf: // the edit counts below are TestKernelIncrementalEqualsScratch's
	case !gen && edited > 0:
		t.Errorf("%d changes edited a bucket in place without a generation to prove the record exact", edited)
	case gen && (edited == 0 || appended == 0 || inserted == 0):
		t.Errorf("%d changes edited buckets in place, %d appended to unordered ones, %d inserted into ordered ones: want some of each", edited, appended, inserted)
	}
	t.Logf("%d of %d changes edited buckets in place (%d appending, %d inserting); %d dispatch nodes declared, %d removed", edited, steps, appended, inserted, nodesIn, nodesOut)
}

// treeNode and treeNodeGone find a dispatch node's declaration and removal in iptables-restore input
// (nodeName: the chain's suffix is T and the node's prefix).
var (
	treeNode     = regexp.MustCompile(`(?m)^:NNM-\S+-T[0-9A-F]+ `)
	treeNodeGone = regexp.MustCompile(`(?m)^-X NNM-\S+-T[0-9A-F]+$`)
)

// oursUnordered is ours with the rules of each bucket of externalIPSharded's first run (one DNAT
// rule: NNM-EXTIP-DNAT-<prefix>) and of its masquerade by original destination (one MASQUERADE
// rule: NNM-EXTIP-MASQ-<prefix>) sorted: their order in the kernel depends on the edits that made
// them. The second run's buckets (NNM-EXTIP-DNAT2-<prefix>: a MARK rule per entry, then a DNAT rule
// per entry) keep their order.
func oursUnordered(save string) string {
	lines := strings.Split(strings.TrimSuffix(ours(save), "\n"), "\n")
	chainOf := func(l string) string {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" && (strings.HasPrefix(f[1], "NNM-EXTIP-DNAT-") || strings.HasPrefix(f[1], "NNM-EXTIP-MASQ-")) {
			return f[1]
		}
		return ""
	}
	for i := 0; i < len(lines); {
		c := chainOf(lines[i])
		j := i + 1
		for c != "" && j < len(lines) && chainOf(lines[j]) == c {
			j++
		}
		slices.Sort(lines[i:j])
		i = j
	}
	return strings.Join(lines, "\n") + "\n"
}

// restoreRecorder keeps the input of every iptables-restore it runs.
type restoreRecorder struct {
	Runner
	inputs []string
}

func (r *restoreRecorder) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	if stdin != nil && strings.HasSuffix(name, "-restore") {
		in, err := io.ReadAll(stdin)
		if err != nil {
			return nil, err
		}
		r.inputs = append(r.inputs, string(in))
		stdin = bytes.NewReader(in)
	}
	return r.Runner.Run(ctx, name, args, stdin, stdout)
}

// ours is the part of an iptables-save that is ours.
func ours(save string) string {
	var b strings.Builder
	for _, l := range strings.Split(save, "\n") {
		if strings.Contains(l, "NNM-") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// How mutateEntries is steered: random (0), adding entries, or emptying a bucket.
const (
	grow = iota + 1
	shrink
)

// mutateEntries changes entries in one random way (or the way steer says); the result has unique
// keys, in random order.
func mutateEntries(rnd *rand.Rand, f rules.Family, in []rules.MapEntry, buckets, steer int) []rules.MapEntry {
	addr := func(bucket, host int) netip.Addr {
		if f == rules.IPv4 {
			return netip.AddrFrom4([4]byte{203, 0, byte(113 + bucket), byte(host + 1)})
		}
		return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::%x", 113+bucket, host+1))
	}
	to := func() netip.AddrPort {
		if f == rules.IPv4 {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(rnd.IntN(250) + 1)}), uint16(8000+rnd.IntN(3)))
		}
		return netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", rnd.IntN(250)+1)), uint16(8000+rnd.IntN(3)))
	}
	random := func() rules.MapEntry {
		proto := []rules.Protocol{rules.TCP, rules.UDP}[rnd.IntN(2)]
		return rules.MapEntry{Addr: addr(rnd.IntN(buckets), rnd.IntN(6)), Protocol: proto, Port: uint16(80 + rnd.IntN(3)), To: to(),
			Comment: fmt.Sprintf("ns/svc-%d:%s", rnd.IntN(100), proto)}
	}
	out := append([]rules.MapEntry(nil), in...)
	op := rnd.IntN(6)
	switch {
	case steer == grow:
		op = 0
	case steer == shrink && len(out) > 0:
		op = 4
	}
	switch {
	case op <= 1 || len(out) == 0: // add a few
		for range 1 + rnd.IntN(4) {
			out = append(out, random())
		}
	case op == 2: // remove one
		i := rnd.IntN(len(out))
		out = append(out[:i], out[i+1:]...)
	case op == 3: // re-point one (same key, other Cluster-IP and comment)
		i := rnd.IntN(len(out))
		out[i].To, out[i].Comment = to(), out[i].Comment+"-moved"
	case op == 4: // empty a bucket
		p := bucketPrefix(out[rnd.IntN(len(out))].Addr)
		kept := out[:0]
		for _, e := range out {
			if bucketPrefix(e.Addr) != p {
				kept = append(kept, e)
			}
		}
		out = kept
	default: // change the port of one (a new key)
		i := rnd.IntN(len(out))
		out[i].Port = uint16(90 + rnd.IntN(3))
	}
	seen := map[string]bool{}
	uniq := out[:0]
	for _, e := range out {
		if !seen[e.Key()] {
			seen[e.Key()] = true
			uniq = append(uniq, e)
		}
	}
	rnd.Shuffle(len(uniq), func(i, j int) { uniq[i], uniq[j] = uniq[j], uniq[i] })
	return uniq
}

// BenchmarkApply10k: one change among 10,000 map entries, as one Service changing at the scale of
// `make bench` (10,000 kernel rules in 625 buckets: one bucket is rendered and rewritten), and
// among 10,000 scattered ones (scatteredDNAT: one entry a bucket, each inlined into the dispatch
// node that lists it; the dispatch nodes are rendered with every inlined entry).
func BenchmarkApply10k(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		f    rules.Family
	}{{"one-entry", rules.IPv4}, {"one-entry", rules.IPv6}, {"new-bucket", rules.IPv4}, {"scattered-one-entry", rules.IPv4}, {"scattered-new-bucket", rules.IPv4}} {
		f := c.f
		b.Run(c.name+"-"+string(f), func(b *testing.B) {
			k := newKernel(b, NFT, f)
			be := k.backend()
			entries := scaleEntries(f, 10000)
			if strings.HasPrefix(c.name, "scattered-") {
				entries = scatteredDNAT(f, 10000).Maps[0].Entries
				// Sorted, as the agent's maps are (fix.ServiceMap): Map.Sorted then copies nothing.
				slices.SortFunc(entries, func(a, b rules.MapEntry) int { return rules.CompareEntries(&a, &b) })
			}
			other := append(entries[:9999:9999], entries[9998])
			other[9999].Port = 81
			if c.name == "scattered-one-entry" { // an inlined entry's Cluster-IP port changes
				other = slices.Clone(entries)
				other[9999].To = netip.AddrPortFrom(other[9999].To.Addr(), 8081)
			}
			if strings.HasSuffix(c.name, "new-bucket") { // one more entry, alone in a /28 of its own
				other = append(entries[:10000:10000], entries[0])
				other[10000].Addr = netip.MustParseAddr("198.51.100.1")
			}
			rs := func(e []rules.MapEntry) *rules.Ruleset {
				r := externalIP(f)
				r.Maps[0].Entries = e
				return r
			}
			if err := apply(ctx, be, rs(entries)); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				e := entries
				if i%2 == 0 {
					e = other
				}
				if err := apply(ctx, be, rs(e)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCommitFloor: one iptables-nft-restore that flushes a chain no packet reaches and appends
// one ACCEPT rule to it, in a namespace holding the nat rules of N map entries: the floor under
// every change the backend makes. The floor grows with what the table holds, not with the change:
// the restore's kernel time (perf on the 10,000-entry ruleset: nft_chain_validate, the commit's
// validation of the table, is the largest part). "dnat" is externalIP (one DNAT rule per entry in
// /28 bucket chains); "dnat+masq" adds the DNAT fix's masquerade by original destination (one more
// rule per entry). sys-ms/op is the restore's system CPU (getrusage of the test's children).
func BenchmarkCommitFloor(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		n    int
		masq bool
	}{{0, false}, {1000, false}, {10000, false}, {10000, true}} {
		name := fmt.Sprintf("dnat-%d", c.n)
		if c.masq {
			name = fmt.Sprintf("dnat+masq-%d", c.n)
		}
		b.Run(name, func(b *testing.B) {
			k := newKernel(b, NFT, rules.IPv4)
			if c.n > 0 {
				rs := externalIP(rules.IPv4)
				rs.Maps[0].Entries = scaleEntries(rules.IPv4, c.n)
				if c.masq {
					rs.Chains = append(rs.Chains, rules.Chain{Name: "EXTIP-CTMASQ", Type: rules.NAT, Hook: rules.Postrouting, Rules: []rules.Rule{
						{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: "external-ips", LookupKey: rules.LookupCTOriginal}, Verdict: rules.Verdict{Kind: rules.Masquerade}},
					}})
				}
				if err := apply(ctx, k.backend(), rs); err != nil {
					b.Fatal(err)
				}
			}
			k.ipt("-t", "nat", "-N", "NNM-BENCH-FLOOR")
			in := "*nat\n-F NNM-BENCH-FLOOR\n-A NNM-BENCH-FLOOR -d 192.0.2.1/32 -j ACCEPT\nCOMMIT\n"
			var before, after syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &before)
			for b.Loop() {
				if _, err := k.run.Run(ctx, k.bin("restore"), []string{"-w", "5", "--noflush"}, strings.NewReader(in), nil); err != nil {
					b.Fatal(err)
				}
			}
			_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &after)
			sys := time.Duration(after.Stime.Nano() - before.Stime.Nano())
			b.ReportMetric(float64(sys.Microseconds())/1000/float64(b.N), "sys-ms/op")
		})
	}
}

// BenchmarkRender10k: the full rendering of 10,000 map entries (10,000 rules), what the cold
// start and a change of chains cost on the Go side before iptables-restore runs.
func BenchmarkRender10k(b *testing.B) {
	rs := externalIP(rules.IPv4)
	rs.Maps[0].Entries = scaleEntries(rules.IPv4, 10000)
	b.ReportAllocs()
	for b.Loop() {
		p, _, _, err := planRuleset(rs)
		if err != nil {
			b.Fatal(err)
		}
		if len(p.String()) == 0 {
			b.Fatal("empty rendering")
		}
	}
}

// BenchmarkColdApplyMemory10k: the first apply of 10,000 map entries (the agent's cold start at the
// scale of `make bench`), reported as the heap it needs at once: peak-MB is the largest heap seen
// above the one before the apply, sampled every 100 µs with the GC kept tight (GOGC=10), so it is the
// live peak within ~10 %. B/op is everything the apply allocates.
func BenchmarkColdApplyMemory10k(b *testing.B) {
	ctx := context.Background()
	k := newKernel(b, NFT, rules.IPv4)
	rs := externalIP(rules.IPv4)
	rs.Maps[0].Entries = scaleEntries(rules.IPv4, 10000)
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	b.ReportAllocs()
	var peak uint64
	for b.Loop() {
		b.StopTimer()
		if _, err := opsOf(k.backend()).RemoveAll(ctx, rules.IPv4); err != nil {
			b.Fatal(err)
		}
		be := k.backend()
		runtime.GC()
		base := heapObjects()
		stop := sampleMax(heapObjects)
		b.StartTimer()
		if err := apply(ctx, be, rs); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		peak = max(peak, stop()-base)
		b.StartTimer()
	}
	b.ReportMetric(float64(peak)/1e6, "peak-MB")
}

// scaleEntries is n map entries as `make bench` has them: one per Service, 250 per IPv4 bucket.
func scaleEntries(f rules.Family, n int) []rules.MapEntry {
	out := make([]rules.MapEntry, n)
	for i := range out {
		a := netip.AddrFrom4([4]byte{172, 16, byte(i / 250), byte(i%250 + 1)})
		to := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})
		if f == rules.IPv6 {
			a = netip.MustParseAddr(fmt.Sprintf("2001:db8:16::%x", i+1))
			to = netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i+1))
		}
		out[i] = rules.MapEntry{Addr: a, Protocol: rules.TCP, Port: 80, To: netip.AddrPortFrom(to, 80), Comment: fmt.Sprintf("bench/svc-%05d:http", i)}
	}
	return out
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// sampleMax polls f until the returned stop is called, which returns the largest value seen.
func sampleMax(f func() uint64) (stop func() uint64) {
	done := make(chan struct{})
	res := make(chan uint64)
	go func() {
		m := f()
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				res <- max(m, f())
				return
			case <-t.C:
				m = max(m, f())
			}
		}
	}()
	return func() uint64 { close(done); return <-res }
}

// TestKernelBucketEdit: with the nf_tables generation, a change of one entry edits its bucket in
// place (deletes and appends, the bucket of one DNAT rule per entry being unordered, not re-declared)
// and leaves what a reconcile from scratch leaves (but for the order of that bucket's rules); after someone else changed the bucket (a foreign rule inserted into it, which moves
// the generation) the next change rewrites the bucket whole, so the foreign rule is gone and nothing
// is built on positions the backend has not seen.
func TestKernelBucketEdit(t *testing.T) {
	for _, f := range rules.Families {
		t.Run(string(f), func(t *testing.T) {
			ctx := context.Background()
			k, scratch := newKernel(t, NFT, f), newKernel(t, NFT, f)
			rec := &restoreRecorder{Runner: k.run}
			b := mustBackend(t, Options{Variant: NFT, Runner: rec, Generation: k.generation})
			entries := scaleEntries(f, 12) // one bucket
			bucket := bucketName("EXTIP-DNAT", 1, bucketPrefix(entries[0].Addr))
			rs := func() *rules.Ruleset {
				r := externalIP(f)
				r.Maps[0].Entries = append([]rules.MapEntry(nil), entries...)
				return r
			}
			mustApply(t, b, rs())
			check := func(what string, wantEdit bool) {
				t.Helper()
				if len(rec.inputs) != 1 {
					t.Fatalf("%s: %d restores, want 1", what, len(rec.inputs))
				}
				in := rec.inputs[0]
				declared := strings.Contains(in, ":"+bucket+" ")
				edits := strings.Contains(in, "\n-A "+bucket+" ") || strings.Contains(in, "\n-D "+bucket+" ")
				edited, rewritten := edits && !declared, declared && !strings.Contains(in, "\n-I ") && !strings.Contains(in, "\n-D ")
				if edited != wantEdit || rewritten == wantEdit {
					t.Errorf("%s: edited in place %v, rewritten %v; want edited %v. Restore input:\n%s", what, edited, rewritten, wantEdit, in)
				}
				if err := apply(ctx, mustBackend(t, Options{Variant: NFT, Runner: scratch.run}), rs()); err != nil {
					t.Fatal(err)
				}
				if got, want := oursUnordered(k.save()), oursUnordered(scratch.save()); got != want {
					t.Errorf("%s: the kernel differs from a reconcile from scratch:\n%s\nwant:\n%s", what, got, want)
				}
				if res, err := verify(ctx, b, rs()); err != nil || res.Applied || res.Repaired {
					t.Errorf("%s: Verify = %+v, %v; want nothing to repair", what, res, err)
				}
				rec.inputs = nil
			}
			rec.inputs = nil
			entries[5].To = netip.AddrPortFrom(entries[5].To.Addr(), entries[5].To.Port()+1)
			mustApply(t, b, rs())
			check("one entry re-pointed", true)

			entries = append(entries[:3], entries[4:]...)
			mustApply(t, b, rs())
			check("one entry removed", true)

			// Another bucket appears (its dispatch rule rewrites the dispatching chain) while an
			// entry of the first changes: every changed chain is rewritten, none edited.
			other := entries[0]
			other.Addr = netip.MustParseAddr(map[rules.Family]string{rules.IPv4: "198.51.100.9", rules.IPv6: "2001:db8:ffff::9"}[f])
			entries = append(entries, other)
			entries[2].To = netip.AddrPortFrom(entries[2].To.Addr(), entries[2].To.Port()+1)
			mustApply(t, b, rs())
			check("a bucket added and one entry re-pointed", false)

			k.ipt("-t", "nat", "-I", bucket, "1", "-p", "udp", "-m", "comment", "--comment", "foreign", "-j", "RETURN")
			entries[7].To = netip.AddrPortFrom(entries[7].To.Addr(), entries[7].To.Port()+1)
			mustApply(t, b, rs())
			check("one entry re-pointed after a foreign rule entered the bucket", false)
			mustLack(t, k.save(), "foreign")
		})
	}
}

// TestBucketEdit: the edit, played on old as iptables would (delete by spec, then insert at each
// position or append), yields now (in an unordered chain: now's rules, in any order); and the cases
// that must be rewritten instead are refused.
func TestBucketEdit(t *testing.T) {
	l := func(specs ...string) []string {
		out := make([]string, len(specs))
		for i, s := range specs {
			out[i] = "-A B -d " + s
		}
		return out
	}
	base := l("a", "b", "c", "d", "e", "f", "g", "h")
	for _, tc := range []struct {
		name          string
		now           []string
		ok, unordered bool // an edit in an ordered chain, in an unordered one
	}{
		{"one added in the middle", l("a", "b", "c", "x", "d", "e", "f", "g", "h"), true, true},
		{"one added first and one last", l("x", "a", "b", "c", "d", "e", "f", "g", "h", "y"), true, true},
		{"one removed", l("a", "b", "d", "e", "f", "g", "h"), true, true},
		{"one replaced", l("a", "b", "c", "x", "e", "f", "g", "h"), true, true},
		{"two replaced far apart (a MARK and a DNAT rule)", l("a", "x", "c", "d", "e", "f", "y", "h"), true, true},
		{"unchanged", base, true, true},
		{"the rules that stay change order", l("b", "a", "c", "d", "e", "f", "g", "h"), false, true},
		{"a rule twice", l("a", "b", "c", "d", "e", "f", "g", "h", "h"), false, false},
		{"more than half changes", l("a", "b", "w", "x", "y", "z", "g", "h"), false, false},
	} {
		for _, unordered := range []bool{false, true} {
			want := map[bool]bool{false: tc.ok, true: tc.unordered}[unordered]
			t.Run(tc.name+map[bool]string{false: "", true: "/unordered"}[unordered], func(t *testing.T) {
				e, ok := bucketEdit(base, tc.now, unordered)
				if ok != want {
					t.Fatalf("ok = %v, want %v (edit %+v)", ok, want, e)
				}
				if !ok {
					return
				}
				chain := append([]string(nil), base...)
				for _, d := range e.deletes {
					i := slices.Index(chain, "-A "+strings.TrimPrefix(d, "-D "))
					if i < 0 {
						t.Fatalf("%q deletes a rule that is not there", d)
					}
					chain = slices.Delete(chain, i, i+1)
				}
				for _, in := range e.inserts {
					if unordered {
						if !strings.HasPrefix(in, "-A B ") {
							t.Fatalf("%q: an unordered edit appends", in)
						}
						chain = append(chain, in)
						continue
					}
					f := strings.SplitN(in, " ", 4) // -I B n spec
					n, err := strconv.Atoi(f[2])
					if err != nil || n < 1 || n > len(chain)+1 {
						t.Fatalf("%q: position out of the chain of %d rules", in, len(chain))
					}
					chain = slices.Insert(chain, n-1, "-A "+f[1]+" "+f[3])
				}
				got, now := chain, tc.now
				if unordered {
					got, now = slices.Sorted(slices.Values(chain)), slices.Sorted(slices.Values(tc.now))
				}
				if !slices.Equal(got, now) {
					t.Errorf("the edit %+v yields\n%v\nwant\n%v", e, chain, tc.now)
				}
			})
		}
	}
}
