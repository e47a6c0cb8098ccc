package iptables

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// TestKernelIncrementalEqualsScratch: a random sequence of map changes (entries added, removed and
// re-pointed, buckets filled and emptied), reconciled one after another, leaves our chains in the
// kernel exactly as reconciling each step's ruleset without a record does (a fresh backend in a
// second namespace), and the record stays true: the incremental backend has no nf_tables
// generation, so each Verify reads the kernel back and must find nothing to repair or send.
func TestKernelIncrementalEqualsScratch(t *testing.T) {
	for _, v := range []Variant{NFT, Legacy} {
		for _, f := range rules.Families {
			t.Run(string(v)+"-"+string(f), func(t *testing.T) {
				ctx := context.Background()
				inc, scratch := newKernel(t, v, f), newKernel(t, v, f)
				b := mustBackend(t, Options{Variant: v, Runner: inc.run, Generation: func() (uint32, error) {
					return 0, errors.New("no generation: Verify reads the kernel")
				}})
				seed := uint64(time.Now().UnixNano())
				t.Logf("seed %d", seed)
				rnd := rand.New(rand.NewPCG(seed, 1))
				var entries []rules.MapEntry
				for step := range 30 {
					entries = mutateEntries(rnd, f, entries)
					rs := externalIP(f)
					rs.Maps[0].Entries = entries
					if err := apply(ctx, b, rs); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					res, err := verify(ctx, b, rs)
					if err != nil || res.Repaired || res.Applied {
						t.Fatalf("step %d: Verify after the change = %+v, %v; the record does not match the kernel", step, res, err)
					}
					fresh := mustBackend(t, Options{Variant: v, Runner: scratch.run})
					if err := apply(ctx, fresh, rs); err != nil {
						t.Fatalf("step %d: from scratch: %v", step, err)
					}
					if got, want := ours(inc.save()), ours(scratch.save()); got != want {
						t.Fatalf("step %d (%d entries): incremental kernel state differs from a reconcile from scratch:\n%s\nwant:\n%s", step, len(entries), got, want)
					}
				}
			})
		}
	}
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

// mutateEntries changes entries in one random way; the result has unique keys, in random order.
func mutateEntries(rnd *rand.Rand, f rules.Family, in []rules.MapEntry) []rules.MapEntry {
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
		return rules.MapEntry{Addr: addr(rnd.IntN(4), rnd.IntN(6)), Protocol: proto, Port: uint16(80 + rnd.IntN(3)), To: to(),
			Comment: fmt.Sprintf("ns/svc-%d:%s", rnd.IntN(100), proto)}
	}
	out := append([]rules.MapEntry(nil), in...)
	switch op := rnd.IntN(6); {
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

// BenchmarkApply10k: one change among 10,000 map entries (20,000 kernel rules in 40 buckets), as
// one Service changing at the scale of `make bench`: one bucket is rendered and rewritten.
func BenchmarkApply10k(b *testing.B) {
	ctx := context.Background()
	for _, f := range rules.Families {
		b.Run("one-entry-"+string(f), func(b *testing.B) {
			k := newKernel(b, NFT, f)
			be := k.backend()
			entries := scaleEntries(f, 10000)
			other := append(entries[:9999:9999], entries[9998])
			other[9999].Port = 81
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

// BenchmarkRender10k: the full rendering of 10,000 map entries (20,000 rules), what the cold
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
		if _, err := k.backend().RemoveAll(ctx, rules.IPv4); err != nil {
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
