// Command datapath measures what the ipvs-externalip-dnat fix's rules cost every new connection on
// the node (issue #42): a client namespace (a pod) and the node itself open new TCP connections
// through the node namespace, where the fix's nat rules are loaded by the real backend, to a server
// namespace whose kernel answers the SYN. It times connect(2) to the handshake's completion (the
// first packet's reply) for traffic that matches no map entry and traffic to an External-IP
// (DNATed), at several map sizes, consecutive and scattered External-IPs, both backends and both
// families; each size is measured beside its floor, the same lab without the agent's rules, in
// the same run. `make bench-datapath` runs it; see BENCHMARKS.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type options struct {
	n                  int
	sizes              []int
	backends, paths    []string
	families           []rules.Family
	layouts            []layout
	runs               int
	hot                int // External-IP traffic goes to the first hot entries only (0: all)
	out, bench, svg    string
	write, progressOff bool
}

// cell is one row's measurement: the rules loaded and the floor, for one path and traffic kind.
type cell struct {
	run                int
	backend            string
	family             rules.Family
	layout             layout
	entries            int
	path, traffic      string // path: "pod" (PREROUTING) or "host" (OUTPUT); traffic: "miss" or "hit"
	rules, floor       probe
	loadTime, loadedAt time.Duration
}

func main() {
	var o options
	var sizes, backends, families, layouts, paths string
	flag.IntVar(&o.n, "n", 10000, "new connections per measurement (each also has its floor)")
	flag.StringVar(&sizes, "sizes", "0,1000,10000,50000", "map sizes (External-IPs, one Service and TCP port each)")
	flag.StringVar(&backends, "backends", "iptables,nftables", "backends")
	flag.StringVar(&families, "families", "ipv4,ipv6", "families")
	flag.StringVar(&layouts, "layouts", "consecutive,scattered", "External-IP layouts: consecutive (172.16.0.1 + i), scattered (one /24 or /120 each)")
	flag.StringVar(&paths, "paths", "pod,host", "where connections start: pod (a client namespace: nat PREROUTING) and host (the node namespace: nat OUTPUT)")
	flag.IntVar(&o.hot, "hot", 0, "send External-IP traffic to the first this many entries only, not to all (0): whether a cost grows with the entries or with the ones in use")
	flag.IntVar(&o.runs, "runs", 1, "repeat the whole matrix this many times (the spread between runs is printed)")
	flag.StringVar(&o.out, "out", "bin/bench-datapath.md", "where the tables go (besides stdout)")
	flag.BoolVar(&o.write, "write", false, "also write the tables into BENCHMARKS.md's datapath section and draw the plot beside it")
	flag.StringVar(&o.bench, "benchmarks", "BENCHMARKS.md", "the BENCHMARKS.md that -write updates")
	flag.StringVar(&o.svg, "svg", "BENCHMARKS-datapath.svg", "the plot that -write draws (beside BENCHMARKS.md)")
	flag.Parse()
	var err error
	if o.sizes, err = ints(sizes); err != nil {
		fail(err)
	}
	o.backends, o.paths = strings.Split(backends, ","), strings.Split(paths, ",")
	for _, f := range strings.Split(families, ",") {
		o.families = append(o.families, rules.Family(f))
	}
	for _, l := range strings.Split(layouts, ",") {
		o.layouts = append(o.layouts, layout(l))
	}
	if os.Geteuid() != 0 {
		fail(fmt.Errorf("needs root: it creates network namespaces"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	m := describeMachine()
	cells, err := measure(ctx, o, os.Stderr)
	m.loadAfter = loadavg()
	if err != nil {
		fail(err)
	}
	text := report(m, o, cells)
	fmt.Print(text)
	if o.out != "" {
		_ = os.MkdirAll(filepath.Dir(o.out), 0o755)
		if err := os.WriteFile(o.out, []byte(text), 0o644); err != nil {
			fail(err)
		}
	}
	if o.write {
		if err := writeBenchmarks(o.bench, o.svg, text); err != nil {
			fail(err)
		}
		if err := os.WriteFile(o.svg, []byte(plot(cells)), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-datapath:", err)
	os.Exit(1)
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("size %q: %w", f, err)
		}
		if v < 0 || v > maxEntries() {
			return nil, fmt.Errorf("size %d: the lab's address plan holds 0 to %d entries (its Service CIDR and floor prefixes)", v, maxEntries())
		}
		out = append(out, v)
	}
	return out, nil
}

// measure runs the matrix in one lab: per run, backend, family, layout and size, the fix's rules
// are loaded into the node and every path and traffic kind measured, each connection through the
// node alternating with the same connection through the floor node (no agent rules).
func measure(ctx context.Context, o options, progress io.Writer) ([]*cell, error) {
	l, err := newLab(ctx)
	if err != nil {
		return nil, err
	}
	defer l.close()
	stopServer := make(chan struct{})
	served, err := l.serve(stopServer)
	if err != nil {
		return nil, err
	}
	defer func() { close(stopServer); <-served }()
	// Warm the lab up (neighbour entries, the server's accept loop, caches) before the first row.
	for _, fam := range o.families {
		for _, nss := range [][2]string{l.client, l.node} {
			if _, err := runPair(nss, 2000, [2]func(int) netip.Addr{plans[fam].clusterIP, plans[fam].clusterIP}); err != nil {
				return nil, fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	cache := map[string]*rules.Ruleset{}
	var cells []*cell
	for run := 1; run <= o.runs; run++ {
		for _, be := range o.backends {
			for _, fam := range o.families {
				p := plans[fam]
				zeroDone := false
				for _, lay := range o.layouts {
					for _, size := range o.sizes {
						if size == 0 && zeroDone {
							continue
						}
						lay := lay
						if size == 0 {
							zeroDone, lay = true, "—"
						}
						key := fmt.Sprint(fam, lay, size)
						rs := cache[key]
						if rs == nil {
							if rs, err = ruleset(p, lay, size); err != nil {
								return nil, err
							}
							cache[key] = rs
						}
						t0 := time.Now()
						if err := l.load(ctx, be, fam, rs); err != nil {
							return nil, fmt.Errorf("%s %s %s %d: load: %w", be, fam, lay, size, err)
						}
						loadTime := time.Since(t0)
						var row []*cell
						for _, path := range o.paths {
							for _, traffic := range []string{"miss", "hit"} {
								if traffic == "hit" && size == 0 {
									continue
								}
								c := &cell{run: run, backend: be, family: fam, layout: lay, entries: size, path: path, traffic: traffic, loadTime: loadTime}
								if err := ctx.Err(); err != nil {
									return nil, err
								}
								if err := l.flushConntrack(ctx); err != nil {
									return nil, err
								}
								if err := measureCell(l, o.n, o.hot, p, c); err != nil {
									return nil, fmt.Errorf("%s %s %s %d %s %s: %w", be, fam, lay, size, c.path, c.traffic, err)
								}
								row = append(row, c)
							}
						}
						for _, c := range row {
							fmt.Fprintf(progress, "run %d %s %s %s %d %s %s: p50 %v p99 %v (floor %v %v), load %v\n", run, be, fam, lay, size, c.path, c.traffic,
								c.rules.pct(50), c.rules.pct(99), c.floor.pct(50), c.floor.pct(99), loadTime.Round(time.Millisecond))
						}
						cells = append(cells, row...)
					}
				}
				if err := l.load(ctx, be, fam, nil); err != nil {
					return nil, fmt.Errorf("%s %s: remove: %w", be, fam, err)
				}
			}
		}
	}
	return cells, nil
}

// targets is the entry index of each of n connections of a cell, at random (the same sequence for
// the same entries): among the first hot entries for External-IP traffic when hot > 0, else among
// all; without entries, among the first 50,000 Cluster-IPs.
func targets(entries, hot int, traffic string, n int) []int {
	rng := rand.New(rand.NewPCG(uint64(entries), 42))
	among := entries
	switch {
	case entries == 0:
		among = 50000
	case hot > 0 && traffic == "hit":
		among = min(hot, entries)
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = rng.IntN(among)
	}
	return idx
}

// measureCell measures one cell, its rules and its floor interleaved (runPair): miss traffic goes to
// Cluster-IPs (no map key), hit traffic to External-IPs of random entries (of the first hot ones
// when hot > 0), and on the floor side to the same entries' twins in the floor node's one
// translation (floorRules: the same DNAT and masquerade by one rule each).
func measureCell(l *lab, n, hot int, p plan, c *cell) error {
	ns := l.client
	if c.path == "host" {
		ns = l.node
	}
	idx := targets(c.entries, hot, c.traffic, n+warmup)
	floor := func(i int) netip.Addr { return p.clusterIP(idx[i]) }
	withRules := floor
	if c.traffic == "hit" {
		withRules = func(i int) netip.Addr { return p.extIP(c.layout, idx[i]) }
		floor = func(i int) netip.Addr { return p.floorExtIP(idx[i]) }
	}
	pr, err := runPair(ns, n, [2]func(int) netip.Addr{withRules, floor})
	c.rules, c.floor = pr[0], pr[1]
	return err
}
