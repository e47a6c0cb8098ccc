package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Targets of issue #42 at 10,000 scattered entries: the first-packet latency over its floor.
const (
	targetP50    = 2 * time.Microsecond
	targetP99    = 10 * time.Microsecond
	targetAt     = 10000
	targetLayout = scattered
)

type machine struct {
	nproc, cpu, kernel, iptables, loadBefore, loadAfter string
}

func describeMachine() machine {
	out := func(name string, args ...string) string {
		b, _ := exec.Command(name, args...).Output()
		return strings.TrimSpace(string(b))
	}
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	return machine{nproc: out("nproc"), cpu: cpu, kernel: out("uname", "-r"), iptables: out("iptables-nft", "--version"), loadBefore: loadavg()}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)) }

func delta(a, b time.Duration) string {
	return fmt.Sprintf("%+.1f", float64(a-b)/float64(time.Microsecond))
}

// rowKey groups a row's cells: one table row per run, backend, family, layout, size and path.
type rowKey struct {
	run     int
	backend string
	family  string
	layout  layout
	entries int
	path    string
}

func keyOf(c *cell) rowKey {
	return rowKey{c.run, c.backend, string(c.family), c.layout, c.entries, c.path}
}

// report is the markdown the benchmark prints, writes to -out and (with -write) into BENCHMARKS.md.
func report(m machine, o options, cells []*cell) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s: %s CPUs (%s), kernel %s, %s; load average (1/5/15 min) before %s, after %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), m.nproc, m.cpu, m.kernel, m.iptables, m.loadBefore, m.loadAfter)
	fmt.Fprintf(&b, "Command: `go run ./bench/datapath %s` (%d new TCP connections per measurement, %d warm-up ones before each).\n\n",
		strings.Join(os.Args[1:], " "), o.n, warmup)
	if o.hot > 0 {
		fmt.Fprintf(&b, "External-IP traffic goes to the first %d entries of each map only (-hot).\n\n", o.hot)
	}
	b.WriteString("First-packet reply latency (connect(2) → handshake done, µs) and new connections per second from one thread; " +
		"*floor* is the same connections through an identical node without the agent's rules (for External-IP traffic it holds one DNAT (a NETMAP) and one masquerade rule), alternating with them connection by connection; Δ is rules − floor. " +
		"*no entry*: to a Cluster-IP (no map key); *External-IP*: to a random entry's External-IP, DNATed and masqueraded (its floor: the same DNAT and masquerade on the floor node by one rule each, to as many distinct addresses, so Δ is the lookup of the entry among the map's).\n\n")
	b.WriteString("| run | backend | family | layout | entries | from | floor p50 / p99 | no entry p50 / p99 | Δ p50 / Δ p99 | conn/s (floor) | External-IP p50 / p99 | Δ p50 / Δ p99 | conn/s (floor) |\n")
	b.WriteString("|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	var keys []rowKey
	byKey := map[rowKey]map[string]*cell{}
	for _, c := range cells {
		k := keyOf(c)
		if byKey[k] == nil {
			keys = append(keys, k)
			byKey[k] = map[string]*cell{}
		}
		byKey[k][c.traffic] = c
	}
	var missed []string
	for _, k := range keys {
		miss, hit := byKey[k]["miss"], byKey[k]["hit"]
		from := map[string]string{"pod": "pod (PREROUTING)", "host": "host (OUTPUT)"}[k.path]
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %d | %s | %s / %s | %s / %s | %s / %s | %.0f (%.0f) |", k.run, k.backend, k.family, k.layout, k.entries, from,
			us(miss.floor.pct(50)), us(miss.floor.pct(99)), us(miss.rules.pct(50)), us(miss.rules.pct(99)),
			delta(miss.rules.pct(50), miss.floor.pct(50)), delta(miss.rules.pct(99), miss.floor.pct(99)), miss.rules.rate(), miss.floor.rate())
		if hit != nil {
			fmt.Fprintf(&b, " %s / %s | %s / %s | %.0f (%.0f) |\n", us(hit.rules.pct(50)), us(hit.rules.pct(99)),
				delta(hit.rules.pct(50), hit.floor.pct(50)), delta(hit.rules.pct(99), hit.floor.pct(99)), hit.rules.rate(), hit.floor.rate())
		} else {
			b.WriteString(" — | — | — |\n")
		}
		if k.entries == targetAt && k.layout == targetLayout {
			for _, c := range []*cell{miss, hit} {
				if c == nil {
					continue
				}
				if d50, d99 := c.rules.pct(50)-c.floor.pct(50), c.rules.pct(99)-c.floor.pct(99); d50 > targetP50 || d99 > targetP99 {
					missed = append(missed, fmt.Sprintf("run %d %s %s %s %s: Δ %s / %s µs", k.run, k.backend, k.family, k.path, c.traffic, delta(c.rules.pct(50), c.floor.pct(50)), delta(c.rules.pct(99), c.floor.pct(99))))
				}
			}
		}
	}
	fmt.Fprintf(&b, "\nTargets at %d %s entries (Δ p50 ≤ %v, Δ p99 ≤ %v, no entry and External-IP): ", targetAt, targetLayout, targetP50, targetP99)
	if len(missed) == 0 {
		b.WriteString("met in every row.\n")
	} else {
		fmt.Fprintf(&b, "**missed** in %d: %s.\n", len(missed), strings.Join(missed, "; "))
	}
	if o.runs > 1 {
		b.WriteString(spread(keys, byKey))
	}
	return b.String()
}

// spread is, per row without its run, the range over the runs of the floor's p50 and of Δ p50 (no
// entry): how far two runs of the same thing differ on this machine.
func spread(keys []rowKey, byKey map[rowKey]map[string]*cell) string {
	var b strings.Builder
	b.WriteString("\nRun-to-run spread (the range over the runs; no-entry traffic): floor p50, Δ p50, Δ p99 (µs)\n\n")
	b.WriteString("| backend | family | layout | entries | from | floor p50 | Δ p50 | Δ p99 |\n|---|---|---|---:|---|---:|---:|---:|\n")
	type k2 struct {
		backend, family string
		layout          layout
		entries         int
		path            string
	}
	var order []k2
	got := map[k2][]*cell{}
	for _, k := range keys {
		kk := k2{k.backend, k.family, k.layout, k.entries, k.path}
		if got[kk] == nil {
			order = append(order, kk)
		}
		got[kk] = append(got[kk], byKey[k]["miss"])
	}
	rng := func(cs []*cell, f func(*cell) time.Duration) string {
		var v []float64
		for _, c := range cs {
			v = append(v, float64(f(c))/1e3)
		}
		return fmt.Sprintf("%.1f–%.1f", slices.Min(v), slices.Max(v))
	}
	for _, k := range order {
		cs := got[k]
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s | %s |\n", k.backend, k.family, k.layout, k.entries, k.path,
			rng(cs, func(c *cell) time.Duration { return c.floor.pct(50) }),
			rng(cs, func(c *cell) time.Duration { return c.rules.pct(50) - c.floor.pct(50) }),
			rng(cs, func(c *cell) time.Duration { return c.rules.pct(99) - c.floor.pct(99) }))
	}
	return b.String()
}

// The datapath section of BENCHMARKS.md lies between these lines; -write replaces what is between.
const (
	sectionBegin = "<!-- bench-datapath: begin (written by make bench-datapath) -->"
	sectionEnd   = "<!-- bench-datapath: end -->"
)

// writeBenchmarks puts text and a link to the plot svg (beside path) between the section's lines.
func writeBenchmarks(path, svg, text string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	before, rest, ok := bytes.Cut(data, []byte(sectionBegin))
	_, after, ok2 := bytes.Cut(rest, []byte(sectionEnd))
	if !ok || !ok2 {
		return fmt.Errorf("%s has no lines %q … %q", path, sectionBegin, sectionEnd)
	}
	var out bytes.Buffer
	out.Write(before)
	out.WriteString(sectionBegin + "\n\n![p50 first-packet latency against map entries](" + filepath.Base(svg) + ")\n\n" + text + "\n" + sectionEnd)
	out.Write(after)
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// plot draws the p50 first-packet latency of the first run against the number of entries, IPv4
// connections from the pod, one panel for traffic that matches no entry and one for External-IP
// traffic: a line per backend and layout (the 0-entry point shared), and the floor (the mean of
// the rows' floors at each size). The y axis is logarithmic.
func plot(cells []*cell) string {
	const W, H, pw, ph, ml, mt = 960, 470, 380, 300, 70, 50
	type series struct {
		name, color string
		dash        bool
		pts         map[int]float64
	}
	colors := map[string]string{"iptables consecutive": "#1f77b4", "iptables scattered": "#d62728", "nftables consecutive": "#2ca02c", "nftables scattered": "#ff7f0e"}
	var sizes []int
	panel := func(traffic string) []*series {
		var out []*series
		by := map[string]*series{}
		floorName := "floor (no agent rules)"
		if traffic == "hit" {
			floorName = "floor (one DNAT rule, one masquerade rule)"
		}
		floor := &series{name: floorName, color: "#555555", dash: true, pts: map[int]float64{}}
		nfloor := map[int]int{}
		zero := map[string]float64{}
		for _, c := range cells {
			if c.run != 1 || c.path != "pod" || c.family != "ipv4" {
				continue
			}
			if !slices.Contains(sizes, c.entries) {
				sizes = append(sizes, c.entries)
			}
			if c.entries == 0 {
				if c.traffic == "miss" {
					zero[c.backend] = float64(c.rules.pct(50)) / 1e3
					floor.pts[0] += float64(c.floor.pct(50)) / 1e3
					nfloor[0]++
				}
				continue
			}
			if c.traffic != traffic {
				continue
			}
			name := c.backend + " " + string(c.layout)
			s := by[name]
			if s == nil {
				s = &series{name: name, color: colors[name], pts: map[int]float64{}}
				by[name] = s
				out = append(out, s)
			}
			s.pts[c.entries] = float64(c.rules.pct(50)) / 1e3
			floor.pts[c.entries] += float64(c.floor.pct(50)) / 1e3
			nfloor[c.entries]++
		}
		for _, s := range out {
			if v, ok := zero[strings.Fields(s.name)[0]]; ok {
				s.pts[0] = v
			}
		}
		for k, n := range nfloor {
			floor.pts[k] /= float64(n)
		}
		return append(out, floor)
	}
	panels := [][]*series{panel("miss"), panel("hit")}
	slices.Sort(sizes)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range panels {
		for _, s := range p {
			for _, v := range s.pts {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	ylo, yhi := math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if yhi/ylo < 10 {
		yhi = ylo * 10
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	b.WriteString(`<text x="480" y="20" text-anchor="middle" font-size="14">First-packet reply latency (p50) of a new TCP connection from a pod, IPv4, against the fix's map entries (make bench-datapath)</text>` + "\n")
	titles := []string{"traffic that matches no entry", "traffic to an External-IP (DNATed)"}
	for pi, p := range panels {
		x0 := float64(ml + pi*(pw+ml+40))
		y0 := float64(mt)
		xOf := func(size int) float64 {
			i := slices.Index(sizes, size)
			return x0 + float64(i)*float64(pw)/float64(max(1, len(sizes)-1))
		}
		yOf := func(v float64) float64 {
			return y0 + float64(ph)*(1-(math.Log10(v)-math.Log10(ylo))/(math.Log10(yhi)-math.Log10(ylo)))
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x0+pw/2, y0-8, titles[pi])
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, pw, ph)
		for d := ylo; d <= yhi*1.0001; d *= 10 {
			for _, m := range []float64{1, 2, 5} {
				v := d * m
				if v > yhi*1.0001 {
					break
				}
				y := yOf(v)
				fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+pw, y)
				fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n", x0-4, y+4, v)
			}
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" transform="rotate(-90 %.0f %.0f)">µs (log scale)</text>`+"\n", x0-45, y0+ph/2, x0-45, y0+ph/2)
		for _, s := range sizes {
			x := xOf(s)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", x, y0+ph+16, s)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">map entries</text>`+"\n", x0+pw/2, y0+ph+32)
		for si, s := range p {
			var pts []string
			for _, size := range sizes {
				if v, ok := s.pts[size]; ok && v > 0 {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(size), yOf(v)))
				}
			}
			dash := ""
			if s.dash {
				dash = ` stroke-dasharray="6 4"`
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), s.color, dash)
			for _, pt := range pts {
				xy := strings.Split(pt, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], s.color)
			}
			ly := y0 + ph + 50 + float64(si%3)*16
			lx := x0 + float64(si/3)*200
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/><text x="%.0f" y="%.0f">%s</text>`+"\n", lx, ly-4, lx+20, ly-4, s.color, dash, lx+26, ly, s.name)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}
