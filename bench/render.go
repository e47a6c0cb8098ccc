package main

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Targets of issue 10 (cold start end to end: issue 7).
const (
	targetRatio   = 1.3
	targetE2E     = 3 * time.Second
	targetP99     = 50 * time.Millisecond
	targetRSSMiB  = 48.0                   // the tables' memory figures are VmHWM/VmRSS kB ÷ 1024: MiB
	targetIdleCPU = 100 * time.Millisecond // over 60 s
	largestTarget = 10000
)

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "**missed**"
}

// render prints the results as markdown tables (readable in a terminal and pasted into BENCHMARKS.md).
func render(m machine, o options, rs []*result) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Run of %s on %s: %s CPUs (%s), kernel %s, %s, %s.\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), host, m.nproc, m.cpu, m.kernel, m.iptables, m.nft)
	fmt.Fprintf(&b, "Load average (1/5/15 min) before: %s, after: %s.\n", m.loadBefore, m.loadAfter)
	fmt.Fprintf(&b, "Command: `go run ./bench %s`; agent flags `--backend <b> --iptables-variant nft --proxy-mode ipvs --families ipv4 --pod-cidrs 10.244.0.0/24 --disable-fix invalid-drop --min-sync-period %v` (sync period default 30s); agent environment: %s.\n\n",
		strings.Join(os.Args[1:], " "), o.minSyncPeriod, envText(o.agentEnv))

	b.WriteString("Cold start (IPv4 single-stack LoadBalancer Services, eTP Local, one TCP port each; a fresh node namespace per row):\n\n")
	b.WriteString("| run | backend | N | load (1/5/15 min) before → after | end to end | informer list/sync | rule programming | floor (one restore / nft -f) | programming / floor | targets (≤1.3× floor, ≤3 s e2e at 10k) |\n")
	b.WriteString("|---:|---|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		rt := ratio(r.program, r.floor)
		target := mark(rt <= targetRatio)
		if r.n >= largestTarget {
			target += " / " + mark(r.e2e <= targetE2E)
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %s → %s | %v | %v | %v | %v | %.2f× | %s |\n", r.run, r.backend, r.n, r.loadBefore, r.loadAfter, ms(r.e2e), ms(r.list), ms(r.program), ms(r.floor), rt, target)
	}

	var full []*result
	for _, r := range rs {
		if len(r.latency) > 0 || r.idleWin > 0 {
			full = append(full, r)
		}
	}
	if len(full) > 0 {
		fmt.Fprintf(&b, "\nChange latency at N = %d, API write started → nf_tables commit after which the kernel shows the change (%d changes of each kind, one at a time):\n\n", full[0].n, o.changes)
		b.WriteString("Floors: \"one-entry floor\" is one process adding one entry to the full ruleset (`nft add element`, or `iptables-restore --noflush` appending its DNAT rule); \"full floor\" is the cold-start floor above.\n\n")
		b.WriteString("| run | backend | change | p50 | p99 | max | one-entry floor | p99 / one-entry floor | p99 / full floor | target p99 ≤ 50 ms |\n")
		b.WriteString("|---:|---|---|---:|---:|---:|---:|---:|---:|---|\n")
		for _, r := range full {
			for _, kind := range changeKinds {
				l := r.latency[kind]
				if len(l) == 0 {
					continue
				}
				p99 := pct(l, 99)
				fmt.Fprintf(&b, "| %d | %s | %s | %v | %v | %v | %v | %.1f× | %.2f× | %s |\n", r.run, r.backend, map[string]string{
					"create": "create (ingress IP set on a new Service)", "update": "update (ingress IP changed)", "delete": "delete (Service deleted)",
				}[kind], ms(pct(l, 50)), ms(p99), ms(pct(l, 100)), ms(r.floorOne), ratio(p99, r.floorOne), ratio(p99, r.floor), mark(p99 <= targetP99))
			}
		}
	}
	b.WriteString("\nResources (peak RSS over the agent's whole run: cold start, and at the largest N also the changes and the idle window; idle = no API changes, only the periodic resync; CPU includes the agent's child processes):\n\n")
	limit := "—"
	if o.manifest != nil {
		limit = o.manifest.limit.String()
	}
	fmt.Fprintf(&b, "| run | backend | N | peak RSS (VmHWM) | VmHWM after the cold start | RSS at end | target RSS ≤ %.0f MiB | DaemonSet memory limit | idle CPU | idle window | target idle CPU ≤ %v per 60 s |\n", targetRSSMiB, targetIdleCPU)
	b.WriteString("|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---|\n")
	for _, r := range rs {
		hwm := float64(r.hwmKB) / 1024
		lim := limit
		if o.manifest != nil {
			lim = fmt.Sprintf("%s (%s)", limit, mark(r.hwmKB*1024 <= o.manifest.limit.Value()))
		}
		idle, win, idleMark := "—", "—", "—"
		if r.idleWin > 0 {
			idle, win = ms(r.idleCPU).String(), r.idleWin.String()
			idleMark = mark(float64(r.idleCPU) <= float64(targetIdleCPU)*float64(r.idleWin)/float64(time.Minute))
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %.1f MiB | %.1f MiB | %.1f MiB | %s | %s | %s | %s | %s |\n", r.run, r.backend, r.n, hwm, float64(r.coldHWMKB)/1024, float64(r.rssKB)/1024,
			mark(hwm <= targetRSSMiB), lim, idle, win, idleMark)
	}
	renderCgroup(&b, o, rs)
	renderPerService(&b, rs)
	var lost []string
	for _, r := range rs {
		if r.overflows > 0 {
			lost = append(lost, fmt.Sprintf("%s N=%d: %d", r.backend, r.n, r.overflows))
		}
	}
	if len(lost) > 0 {
		fmt.Fprintf(&b, "\nNetlink notification overflows (a commit time may be later than measured by up to the overflow): %s\n", strings.Join(lost, ", "))
	}
	return b.String()
}

// renderPerService prints, per run and backend measured at more than one N, what each Service adds to
// the cold start's VmHWM between consecutive sizes (KiB per Service): flat if memory grows linearly.
func renderPerService(b *strings.Builder, rs []*result) {
	type key struct {
		run     int
		backend string
	}
	byKey := map[key][]*result{}
	var order []key
	for _, r := range rs {
		k := key{r.run, r.backend}
		if byKey[k] == nil {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], r)
	}
	header := false
	for _, k := range order {
		sizes := byKey[k]
		for i := 1; i < len(sizes); i++ {
			a, z := sizes[i-1], sizes[i]
			if z.n <= a.n {
				continue
			}
			if !header {
				b.WriteString("\nCost per Service: VmHWM after the cold start, added per Service between two sizes:\n\n")
				b.WriteString("| run | backend | from N | to N | VmHWM after the cold start | added per Service |\n")
				b.WriteString("|---:|---|---:|---:|---:|---:|\n")
				header = true
			}
			fmt.Fprintf(b, "| %d | %s | %d | %d | %.1f → %.1f MiB | %.2f KiB |\n", k.run, k.backend, a.n, z.n,
				float64(a.coldHWMKB)/1024, float64(z.coldHWMKB)/1024, float64(z.coldHWMKB-a.coldHWMKB)/float64(z.n-a.n))
		}
	}
}

func envText(env []string) string {
	if len(env) == 0 {
		return "nothing added"
	}
	return "`" + strings.Join(env, " ") + "`"
}

// renderCgroup prints the agent's memory as its cgroup accounted it (cgroup.go) beside its VmHWM.
func renderCgroup(b *strings.Builder, o options, rs []*result) {
	header := false
	for _, r := range rs {
		if r.cgEnd == nil {
			continue
		}
		if !header {
			limit := "no limit"
			if o.manifest != nil {
				limit = "memory limit " + o.manifest.limit.String() + " (the DaemonSet's)"
			}
			fmt.Fprintf(b, "\nMemory cgroup of the agent (cgroup %s, %s; the agent and its child processes, their kernel memory and page cache): peak against process VmHWM; the breakdown is of the 50 ms sample with the highest usage:\n\n", r.cgEnd.version, limit)
			b.WriteString("| run | backend | N | VmHWM | cgroup peak after the cold start | cgroup peak | spare under the limit | current at end | OOM kills | breakdown at the peak |\n")
			b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
			header = true
		}
		fmt.Fprintf(b, "| %d | %s | %d | %.1f MiB | %s | %s | %s | %s | %d | %v |\n", r.run, r.backend, r.n, float64(r.hwmKB)/1024,
			mib(r.cgCold.peak), mib(r.cgEnd.peak), spare(o, r.cgEnd.peak), mib(r.cgEnd.current), r.cgEnd.oomKills, r.cgEnd.atPeak)
	}
}

// spare is what a peak of b bytes leaves under the DaemonSet's limit.
func spare(o options, b int64) string {
	if o.manifest == nil || b < 0 {
		return "—"
	}
	lim := o.manifest.limit.Value()
	return fmt.Sprintf("%s (%.0f %%)", mib(lim-b), 100*float64(lim-b)/float64(lim))
}
