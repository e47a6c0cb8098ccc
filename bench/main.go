// Command bench measures the agent at scale against a real kube-apiserver (make bench; see
// BENCHMARKS.md): cold start with N LoadBalancer Services, change latency, memory and idle CPU, each
// against the kernel's own floor (one iptables-restore / nft -f of the same rules).
//
//	go run ./bench -n 1000,10000 -backends iptables,nftables
//	go run ./bench -manifest -conntrack 100000,250000   # stale-udp-conntrack's peak RSS (conntrack.go)
//	go run ./bench -fleet 50,200 -fleet-restart 50      # what K agent starts cost the apiserver (fleet.go)
//	go run ./bench -kube-proxy nftables,iptables -n 1000,10000 -changes 50  # beside kube-proxy (kubeproxy.go)
//
// It needs root (network namespaces), bin/network-node-manager (make build) and bin/etcd,
// bin/kube-apiserver (make controlplane). Every kernel change happens in namespaces it creates.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

type options struct {
	sizes         []int
	backends      []string
	changes       int
	idle          time.Duration
	minSyncPeriod time.Duration
	agentLogLevel string
	out           string
	samples       string // every change latency, one per line (-samples)
	floorRuns     int
	runs          int
	agentEnv      []string
	profileDir    string    // heap profiles of a -tags profile agent go here ("" = stock agent)
	agentBin      string    // the agent binary ("" = agenttest's default, bin/network-node-manager)
	manifest      *manifest // the DaemonSet's environment and memory limit, with -manifest
}

func main() {
	if spec := os.Getenv(fleetChildEnv); spec != "" {
		if err := fleetChild(spec); err != nil {
			log.Fatal(err)
		}
		return
	}
	if spec := os.Getenv(ctChildEnv); spec != "" {
		if err := conntrackChild(spec); err != nil {
			log.Fatal(err)
		}
		return
	}
	var o options
	sizes := flag.String("n", "10000", "numbers of LoadBalancer Services, ascending (e.g. 1000,10000)")
	backends := flag.String("backends", "iptables,nftables", "backends to measure")
	flag.IntVar(&o.changes, "changes", 100, "changes of each kind (create, update, delete) at the largest N")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "window for idle CPU at the largest N")
	flag.DurationVar(&o.minSyncPeriod, "min-sync-period", 0, "agent --min-sync-period (0: changes are not rate limited; they are spaced apart anyway)")
	flag.StringVar(&o.agentLogLevel, "agent-log-level", "info", "agent --log-level (debug shows every pass and read-back in the agent's log)")
	flag.StringVar(&o.out, "out", "", "also write the result table (markdown) to this file")
	flag.StringVar(&o.samples, "samples", "", "also write every change latency, in the order measured, to this file (which changes make the tail)")
	flag.IntVar(&o.floorRuns, "floor-runs", 3, "floor measurements per figure (median)")
	flag.IntVar(&o.runs, "runs", 3, "measure every backend at every N this many times, each with a fresh agent and node namespace (the Services are created once)")
	agentEnv := flag.String("agent-env", "", "comma-separated KEY=VALUE added to the agent's environment (e.g. GOMEMLIMIT=48MiB)")
	useManifest := flag.Bool("manifest", false, "run the agent with the DaemonSet's environment (deploy/base/daemonset.yaml, e.g. GOMEMLIMIT) and compare its peak RSS with the DaemonSet's memory limit")
	ctSizes := flag.String("conntrack", "", "instead of the Services benchmark: the peak RSS of stale-udp-conntrack with conntrack tables of these sizes (e.g. 100000,250000); with -manifest under the DaemonSet's GOMEMLIMIT")
	ctOld := flag.Bool("conntrack-old", false, "with -conntrack: measure the dump main had before issue 19 (every DNAT entry held) instead of the fix")
	hostile := flag.String("hostile", "", "instead of the Services benchmark: <services>x<ports> LoadBalancer Services of one tenant (issue #41 row 2), e.g. 4x30000; with -manifest under the DaemonSet's settings")
	flag.StringVar(&o.agentBin, "agent-bin", "", "the agent binary (default bin/network-node-manager)")
	flag.StringVar(&o.profileDir, "profile", "", "build the agent with -tags profile and write heap profiles (after the cold start, the changes and the idle window) to this directory")
	fleet := flag.String("fleet", "", "instead of the Services benchmark: K concurrent watcher starts against the real apiserver with -fleet-n Services, for each K (e.g. 50,200,500) and each of -fleet-kinds (fleet.go)")
	fleetN := flag.Int("fleet-n", 10000, "with -fleet: LoadBalancer Services in the apiserver")
	fleetKinds := flag.String("fleet-kinds", "agent,kube-proxy,list", "with -fleet: the watchers (agent, agent-json, kube-proxy, list, list-json; kind@50/200 limits a kind to those Ks; none: only -fleet-restart and -fleet-outage)")
	fleetRestart := flag.Int("fleet-restart", 0, "with -fleet: also restart kube-apiserver under this many synced agents (and kube-proxies)")
	fleetOutage := flag.Int("fleet-outage", 0, "with -fleet: also start this many agents while kube-apiserver is down")
	fleetBefore := flag.String("fleet-outage-before", "", "with -fleet-outage: another build of the bench (e.g. before a fix) whose child runs the outage phase first, for a before/after")
	fleetDown := flag.Duration("fleet-downtime", 5*time.Second, "with -fleet-restart and -fleet-outage: how long kube-apiserver is down")
	kubeProxy := flag.String("kube-proxy", "", "instead of the Services benchmark: the real kube-proxy (bin/kube-proxy) in each of these modes (nftables,iptables) beside the agent in one node namespace, -changes Service changes of each kind at each -n, the time from the API write to each one's rule in the kernel (kubeproxy.go)")
	fleetConditions := flag.Int("fleet-conditions", 0, "with -fleet: also the Node conditions' API cost with this many agents' publishers (conditions.go)")
	flag.Parse()
	if *agentEnv != "" {
		o.agentEnv = strings.Split(*agentEnv, ",")
	}
	if *useManifest {
		m, err := readManifest()
		if err != nil {
			log.Fatal(err)
		}
		o.manifest = m
		o.agentEnv = append(o.agentEnv, m.env...)
	}
	if *ctSizes != "" {
		var sizes []int
		for _, s := range strings.Split(*ctSizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n <= 0 {
				log.Fatalf("-conntrack: bad size %q", s)
			}
			sizes = append(sizes, n)
		}
		if err := runConntrack(context.Background(), sizes, o.manifest, *ctOld); err != nil {
			log.Fatal(err)
		}
		return
	}
	if o.profileDir != "" {
		dir, err := filepath.Abs(o.profileDir)
		if err != nil {
			log.Fatal(err)
		}
		o.profileDir = dir
		bin, err := buildProfiling(o.profileDir)
		if err != nil {
			log.Fatal(err)
		}
		o.agentBin = bin
		o.agentEnv = append(o.agentEnv, profileEnv+"="+o.profileDir)
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			log.Fatalf("-n: bad size %q", s)
		}
		o.sizes = append(o.sizes, n)
	}
	o.backends = strings.Split(*backends, ",")

	if *fleet != "" {
		fo := fleetOptions{n: *fleetN, restartK: *fleetRestart, outageK: *fleetOutage, downtime: *fleetDown, conditionsK: *fleetConditions, out: o.out}
		fo.outageBefore, fo.only = *fleetBefore, map[string][]int{}
		if *fleetKinds != "none" {
			for _, kind := range strings.Split(*fleetKinds, ",") {
				kind, ks, limited := strings.Cut(kind, "@")
				fo.kinds = append(fo.kinds, kind)
				for _, s := range strings.Split(ks, "/") {
					if k, err := strconv.Atoi(s); limited && err == nil {
						fo.only[kind] = append(fo.only[kind], k)
					}
				}
			}
		}
		for _, s := range strings.Split(*fleet, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || k <= 0 {
				log.Fatalf("-fleet: bad K %q", s)
			}
			fo.ks = append(fo.ks, k)
		}
		if err := controlplane.CheckPrerequisites(""); err != nil {
			log.Fatal(err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runFleet(ctx, fo); err != nil {
			log.Printf("bench failed: %v", err)
			os.Exit(1)
		}
		return
	}
	if err := agenttest.CheckPrerequisites(); err != nil {
		log.Fatal(err)
	}
	if err := controlplane.CheckPrerequisites(""); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *kubeProxy != "" {
		if err := runKubeProxy(ctx, o, strings.Split(*kubeProxy, ",")); err != nil {
			log.Printf("bench failed: %v", err)
			os.Exit(1)
		}
		return
	}
	if *hostile != "" {
		if err := runHostile(ctx, o, *hostile); err != nil {
			log.Printf("bench failed: %v", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, o); err != nil {
		log.Printf("bench failed: %v", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	machine := describeMachine()
	logf("machine: %s", machine.oneLine())
	start := time.Now()
	largest := o.sizes[len(o.sizes)-1]
	if largest > scaleNodePorts {
		return fmt.Errorf("-n %d: every scale Service takes a health-check node port and the range %s holds %d", largest, scaleNodePortRange, scaleNodePorts)
	}
	for _, be := range o.backends {
		if limit := fix.MaxEntriesPerFixFor(be); largest > limit {
			return fmt.Errorf("-n %d: one entry per scale Service, and the fix programs at most %d with the %s backend (fix.MaxEntriesPerFixFor): the cold start would never see all of them", largest, limit, be)
		}
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceNodePortRange: scaleNodePortRange})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer cp.Close()
	logf("control plane up in %v (node-port range %s)", time.Since(start).Round(time.Millisecond), scaleNodePortRange)

	c, err := newCluster(cp)
	if err != nil {
		return err
	}
	var results []*result
	for _, n := range o.sizes {
		t0 := time.Now()
		if err := c.seedServices(ctx, n); err != nil {
			return err
		}
		logf("%d LoadBalancer Services exist (wrote the missing ones in %v)", n, time.Since(t0).Round(time.Millisecond))
		for run := 1; run <= o.runs; run++ {
			for _, be := range o.backends {
				share, waited, err := waitQuiet(ctx)
				if err != nil {
					return err
				}
				if share >= quietIdle {
					logf("machine settled: %.0f%% idle over the last second after %v", 100*share, waited.Round(time.Second))
				} else {
					logf("machine did not settle: %.0f%% idle over the last second after %v; starting anyway", 100*share, waited.Round(time.Second))
				}
				before := loadAvg()
				r, err := measure(ctx, cp, c, o, be, n, run, n == largest)
				if err != nil {
					return fmt.Errorf("%s at %d: %w", be, n, err)
				}
				r.loadBefore, r.loadAfter = before, loadAvg()
				results = append(results, r)
				logf("run %d: %s", run, r.summary())
			}
		}
	}
	machine.loadAfter = loadAvg()
	return report(o, render(machine, o, results), func() string { return latencySamples(results) })
}

// report prints a run's table and writes it to -out and its samples to -samples when they are set.
func report(o options, table string, samples func() string) error {
	fmt.Println()
	fmt.Println(table)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(table), 0o644); err != nil {
			return err
		}
	}
	if o.samples != "" {
		return os.WriteFile(o.samples, []byte(samples()), 0o644)
	}
	return nil
}

// latencySamples is every change latency of results, one per line in the order measured: run,
// backend, kind, the change's index (create i sets the i-th ingress IP of the create range, update i
// moves it to the i-th of the update range, delete i deletes its Service) and milliseconds.
func latencySamples(results []*result) string {
	var b strings.Builder
	b.WriteString("# run backend kind index ms\n")
	for _, r := range results {
		for _, kind := range changeKinds {
			for i, d := range r.latency[kind] {
				fmt.Fprintf(&b, "%d %s %s %d %.1f\n", r.run, r.backend, kind, i, float64(d.Microseconds())/1000)
			}
		}
	}
	return b.String()
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// machine describes where the figures come from.
type machine struct {
	nproc, kernel, iptables, nft, cpu, loadBefore, loadAfter string
}

func describeMachine() machine {
	out := func(name string, args ...string) string {
		b, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(b))
	}
	m := machine{
		nproc:      out("nproc"),
		kernel:     out("uname", "-r"),
		iptables:   out("iptables", "--version"),
		nft:        out("nft", "--version"),
		loadBefore: loadAvg(),
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return m
}

func (m machine) oneLine() string {
	return fmt.Sprintf("%s CPUs (%s), kernel %s, %s, %s, load average %s", m.nproc, m.cpu, m.kernel, m.iptables, m.nft, m.loadBefore)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
