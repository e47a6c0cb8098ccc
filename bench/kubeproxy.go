package main

// Side by side with kube-proxy (-kube-proxy nftables,iptables; make bench-kube-proxy): the real
// kube-proxy (bin/kube-proxy) and the agent in one node namespace against one kube-apiserver, and
// for each Service change the time from the API write to kube-proxy's rule for it in the kernel and
// to the agent's. The commits are read from the kernel's nf_tables notifications (nltxn.go): which
// commit added or removed the change's address in whose table and chain, timed when its first
// notification arrived. Nothing is read back, and no commit is attributed by process name (both
// sides run nft, or both iptables-nft-restore into the nat table).

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
)

const (
	sbsNode   = "bench-node"
	sbsNodeIP = "192.0.2.10"
	// sbsMinSync is kube-proxy's default minSyncPeriod in iptables and nftables modes (v1.37; the
	// flag is --iptables-min-sync-period for both) and the agent's default minSyncPeriod: both are
	// given it explicitly.
	sbsMinSync = time.Second
	// A change is written only when the last commit is sbsGap old and the last API write
	// sbsWriteGap old, so that neither side's rate limit holds it back by the previous change: each
	// figure is the reaction to a lone change. The pass for a write may itself wait up to
	// sbsMinSync behind the one before, commit nothing (a Service created without an ingress IP)
	// and still hold the next pass back by sbsMinSync: hence twice that after a write.
	sbsGap      = sbsMinSync + 200*time.Millisecond
	sbsWriteGap = 2*sbsMinSync + 200*time.Millisecond
	// sbsTimeout bounds the wait for one change's rules.
	sbsTimeout = 60 * time.Second
)

// Addresses of the change Services: ingress IP createBase + i + 1 (cluster.go), one endpoint on
// this node at sbsEPBase + i + 1, moved to sbsEPMoved + i + 1 by the endpoint change. The watcher
// tracks these ranges only.
var (
	sbsEPBase  = netip.MustParseAddr("10.112.0.0")
	sbsEPMoved = netip.MustParseAddr("10.113.0.0")
	sbsTrack   = newTracker(netip.PrefixFrom(createBase, 16), netip.PrefixFrom(sbsEPBase, 16), netip.PrefixFrom(sbsEPMoved, 16))
)

// sbsKinds are the changes measured, in order: the ingress IP set on an existing Service (a load
// balancer controller's status write), its one endpoint moved to another Pod IP (an EndpointSlice
// update), the Service deleted.
var sbsKinds = []string{"create", "endpoints", "delete"}

// where says where one side's rule for a change Service lives: its ingress IP as a key of the sets
// or maps (elem) or as a constant of the rules in table's chains whose name starts with prefix;
// its endpoint's address in the rules of epTable's chains named epPrefix* (epPrefix "": the side
// has no rule for endpoints).
type where struct {
	elem              bool
	table, prefix     string
	epTable, epPrefix string
}

// kubeProxyRules is where kube-proxy v1.37 puts a LoadBalancer Service's rules (pkg/proxy/nftables
// and pkg/proxy/iptables): the ingress IP in map service-ips of table ip kube-proxy, or in a rule
// of KUBE-SERVICES in the nat table; the endpoint's address in the rules of the Service port's
// service-… chain (which DNATs to the endpoints), or of its KUBE-SEP-… chain.
func kubeProxyRules(mode string) (where, error) {
	switch mode {
	case "nftables":
		return where{elem: true, table: "kube-proxy", prefix: "service-ips", epTable: "kube-proxy", epPrefix: "service-"}, nil
	case "iptables":
		return where{table: "nat", prefix: "KUBE-SERVICES", epTable: "nat", epPrefix: "KUBE-SEP-"}, nil
	}
	return where{}, fmt.Errorf("kube-proxy mode %q: the side-by-side benchmark runs nftables and iptables", mode)
}

// agentRules is where ipvs-externalip-dnat puts an ingress IP's DNAT with backend be (kernel.go):
// map svc of its nftables table, or a rule of NNM-EXTIP-DNAT and its buckets in the nat table. The
// DNAT goes to the Cluster-IP: an endpoint change is none of its business.
func agentRules(be string) where {
	if be == backend.NFTables {
		return where{elem: true, table: nftTable, prefix: nftMap}
	}
	return where{table: "nat", prefix: strings.TrimPrefix(iptDNATPfx, "-A ")}
}

// want is one side's rule that a change makes appear (sign 1) or go (-1).
type want struct {
	side          string
	elem          bool
	table, prefix string
	ip            netip.Addr
	sign          int
}

func (w want) met(t txn) bool {
	return t.net(w.elem, w.table, w.prefix, w.ip.As4())*w.sign > 0
}

// wantsFor are the rules of both sides that change kind of the i-th change Service makes appear or go.
func wantsFor(kind string, i int, kp, agent where) []want {
	lb := nthAddr(createBase, i)
	switch kind {
	case "create":
		return []want{{"kube-proxy", kp.elem, kp.table, kp.prefix, lb, 1}, {"agent", agent.elem, agent.table, agent.prefix, lb, 1}}
	case "endpoints":
		out := []want{{"kube-proxy", false, kp.epTable, kp.epPrefix, nthAddr(sbsEPMoved, i), 1}}
		if agent.epPrefix != "" {
			out = append(out, want{"agent", false, agent.epTable, agent.epPrefix, nthAddr(sbsEPMoved, i), 1})
		}
		return out
	case "delete":
		return []want{{"kube-proxy", kp.elem, kp.table, kp.prefix, lb, -1}, {"agent", agent.elem, agent.table, agent.prefix, lb, -1}}
	}
	return nil
}

// waitWants waits for the first commit, announced after since, that makes each of wants hold, and
// returns when each commit's first notification arrived. After a lost notification (overflow) a
// want that never shows is given up at the timeout (lost true) instead of failing the run.
// seen is raised to the time of every commit announced meanwhile (for settle).
func waitWants(ctx context.Context, w *genWatcher, since time.Time, timeout time.Duration, wants []want, seen *time.Time) (at []time.Time, lost bool, err error) {
	at = make([]time.Time, len(wants))
	left, overflowed := len(wants), false
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for left > 0 {
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-deadline.C:
			if overflowed {
				return at, true, nil
			}
			var missing []string
			for i, wt := range wants {
				if at[i].IsZero() {
					missing = append(missing, fmt.Sprintf("%s's %s %v in %s/%s*", wt.side, map[int]string{1: "add of", -1: "removal of"}[wt.sign], wt.ip, wt.table, wt.prefix))
				}
			}
			return nil, false, fmt.Errorf("%w: no commit carried %s", errTimeout, strings.Join(missing, ", "))
		case e := <-w.events:
			if e.at.After(*seen) {
				*seen = e.at
			}
			if e.overflow {
				overflowed = true
				continue
			}
			if e.first.Before(since) {
				continue
			}
			for i, wt := range wants {
				if at[i].IsZero() && wt.met(e.txn) {
					at[i], left = e.first, left-1
				}
			}
		}
	}
	return at, false, nil
}

// quiet is when the benchmark last wrote to the API and when the last commit was announced.
type quiet struct{ write, commit time.Time }

// settle waits until the last commit is commitGap old and the last write writeGap old, raising
// q.commit with the commits announced meanwhile (at most limit in all).
func settle(ctx context.Context, w *genWatcher, q *quiet, commitGap, writeGap, limit time.Duration) error {
	start := time.Now()
	for {
		due := q.write.Add(writeGap)
		if c := q.commit.Add(commitGap); c.After(due) {
			due = c
		}
		wait := time.Until(due)
		if wait <= 0 {
			return nil
		}
		if time.Since(start) > limit {
			logf("still committing %v after the last write; writing anyway", time.Since(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-w.events:
			if e.at.After(q.commit) {
				q.commit = e.at
			}
		case <-time.After(wait):
		}
	}
}

// sbsResult is one kube-proxy mode at one N.
type sbsResult struct {
	mode, backend string
	n             int
	agentMinSync  time.Duration // the agent's --min-sync-period
	kpReady       time.Duration // kube-proxy start → /proxyMode answers and its first sync is done
	agentReady    time.Duration // agent start → all N entries in the kernel (polled every second)
	latency       map[string]map[string][]time.Duration
	lost          int // changes whose commit was in a lost notification (overflow)
	overflows     int
	kpHWM, agHWM  int64 // VmHWM kB at the end
	loadAfter     string
	samples       []sbsSample // every latency, in the order measured (-samples)
}

type sbsSample struct {
	kind, side string
	i          int
	written    time.Time
	d          time.Duration
}

func runKubeProxy(ctx context.Context, o options, modes []string) error {
	for _, m := range modes {
		if _, err := kubeProxyRules(m); err != nil {
			return err
		}
	}
	version, err := kubeproxytest.Version()
	if err != nil {
		return err
	}
	machine := describeMachine()
	logf("machine: %s; kube-proxy %s", machine.oneLine(), version)
	largest := o.sizes[len(o.sizes)-1]
	if largest > scaleNodePorts {
		return fmt.Errorf("-n %d: every scale Service takes a health-check node port and the range %s holds %d", largest, scaleNodePortRange, scaleNodePorts)
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceNodePortRange: scaleNodePortRange})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer cp.Close()
	c, err := newCluster(cp)
	if err != nil {
		return err
	}
	if err := kubeproxytest.CreateNode(ctx, c.client, sbsNode, sbsNodeIP); err != nil {
		return err
	}
	var results []*sbsResult
	for _, n := range o.sizes {
		t0 := time.Now()
		if err := c.seedServices(ctx, n); err != nil {
			return err
		}
		if err := c.seedEndpointSlices(ctx, n); err != nil {
			return err
		}
		logf("%d LoadBalancer Services with their EndpointSlices exist (%v)", n, time.Since(t0).Round(time.Millisecond))
		for _, mode := range modes {
			r, err := sideBySide(ctx, cp, c, o, mode, n)
			if err != nil {
				return fmt.Errorf("kube-proxy %s mode at %d: %w", mode, n, err)
			}
			r.loadAfter = loadAvg()
			results = append(results, r)
			logf("%s", r.summary())
		}
	}
	machine.loadAfter = loadAvg()
	return report(o, renderKubeProxy(machine, version, o, results), func() string { return sbsSamples(results) })
}

// sbsSamples is every latency measured, one per line in the order written: mode, N, kind, the
// change's index, the side, when the write started (UTC, to be found in the logs) and milliseconds.
func sbsSamples(rs []*sbsResult) string {
	var b strings.Builder
	b.WriteString("# mode n kind index side written ms\n")
	for _, r := range rs {
		for _, s := range r.samples {
			fmt.Fprintf(&b, "%s %d %s %d %s %s %.1f\n", r.mode, r.n, s.kind, s.i, s.side, s.written.UTC().Format("15:04:05.000"), float64(s.d.Microseconds())/1000)
		}
	}
	return b.String()
}

// sideBySide starts kube-proxy in mode and the agent in a fresh node namespace and measures the changes.
func sideBySide(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, o options, mode string, n int) (*sbsResult, error) {
	be, _ := detect.BackendFor(mode) // the backend `backend: auto` takes beside this mode
	r := &sbsResult{mode: mode, backend: be, n: n, latency: map[string]map[string][]time.Duration{}}
	kpRules, _ := kubeProxyRules(mode)
	ns := fmt.Sprintf("nnmk-%s-%d", mode[:3], n)
	kc, done, err := nodeNamespace(ctx, cp, ns)
	if err != nil {
		return nil, err
	}
	defer done()
	w, err := newTxnWatcher(netns.Path(ns), sbsTrack)
	if err != nil {
		return nil, err
	}
	defer w.Close()

	kpLog := fmt.Sprintf("%s/nnm-bench-kube-proxy-%s-%d.log", os.TempDir(), mode, n)
	_ = os.Remove(kpLog)
	t0 := time.Now()
	kp, err := kubeproxytest.Start(kubeproxytest.Options{Netns: ns, Kubeconfig: kc, Mode: mode, NodeName: sbsNode,
		LogFile: kpLog, Args: []string{"--iptables-min-sync-period=" + sbsMinSync.String()}}) // also nftables mode's (every mode but ipvs)
	if err != nil {
		return nil, err
	}
	defer kp.Stop(10 * time.Second)
	if err := kp.WaitMode(ctx, 10*time.Minute); err != nil {
		return nil, fmt.Errorf("kube-proxy: %w\n%s", err, kp.LogTail(20))
	}
	r.kpReady = time.Since(t0)
	logf("kube-proxy %s mode N=%d: synced after %v (log %s)", mode, n, r.kpReady.Round(time.Millisecond), kpLog)

	agLog := fmt.Sprintf("%s/nnm-bench-agent-beside-%s-%d.log", os.TempDir(), mode, n)
	_ = os.Remove(agLog)
	minSync := sbsMinSync
	if flagSet("min-sync-period") {
		minSync = o.minSyncPeriod
	}
	r.agentMinSync = minSync
	// The agent is told kube-proxy's mode is ipvs: ipvs-externalip-dnat, the fix that programs a
	// rule per Service, refuses to run beside nftables and iptables modes (BENCHMARKS.md says why
	// this is the comparison).
	args := []string{
		"--kubeconfig", kc, "--node-name", sbsNode, "--backend", be, "--iptables-variant", "nft",
		"--proxy-mode", "ipvs", "--families", "ipv4", "--pod-cidrs", "10.244.0.0/24",
		"--disable-fix", "invalid-drop", "--min-sync-period", minSync.String(), "--log-level", o.agentLogLevel,
	}
	t0 = time.Now()
	a, err := agenttest.Start(agenttest.Options{Netns: ns, Bin: o.agentBin, Args: args, Env: o.agentEnv, LogFile: agLog})
	if err != nil {
		return nil, err
	}
	defer a.Stop(agenttest.StopGrace)
	k := kernelFor(be)
	err = agenttest.Poll(ctx, 10*time.Minute, time.Second, func() error {
		if err := a.Exited(); err != nil {
			return agenttest.Permanent(fmt.Errorf("agent exited: %w\n%s", err, a.LogTail(20)))
		}
		got, err := k.entries(ctx, ns)
		if err == nil && got != n {
			err = fmt.Errorf("the kernel holds %d of the agent's %d entries", got, n)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("agent cold start: %w", err)
	}
	r.agentReady = time.Since(t0)
	logf("agent (%s backend) beside kube-proxy %s mode N=%d: all entries after %v (log %s)", be, mode, n, r.agentReady.Round(time.Millisecond), agLog)

	if err := sbsChanges(ctx, c, w, kpRules, agentRules(be), o.changes, r, func() string {
		return "kube-proxy:\n" + kp.LogTail(10) + "\nagent:\n" + a.LogTail(10)
	}); err != nil {
		return nil, err
	}
	r.overflows = w.Overflows()
	r.kpHWM, _, _ = memory(kp.PID())
	r.agHWM, _, _ = memory(a.PID())
	return r, nil
}

// sbsChanges makes count changes of each kind, one at a time, and records both sides' latencies.
func sbsChanges(ctx context.Context, c *cluster, w *genWatcher, kp, agent where, count int, r *sbsResult, logs func() string) error {
	svcs := c.client.CoreV1().Services(namespace)
	slices := c.client.DiscoveryV1().EndpointSlices(namespace)
	name := func(i int) string { return fmt.Sprintf("kp%s-%04d", r.mode[:3], i) }
	objs := make([]*corev1.Service, count)
	eps := make([]*discoveryv1.EndpointSlice, count)
	q := quiet{write: time.Now()}
	timed := func(kind string, i int, write func() error) error {
		if err := settle(ctx, w, &q, sbsGap, sbsWriteGap, 30*time.Second); err != nil {
			return err
		}
		w.drain()
		tw := time.Now()
		err := write()
		q.write = time.Now()
		if err != nil {
			return fmt.Errorf("%s %d: %w", kind, i, err)
		}
		wants := wantsFor(kind, i, kp, agent)
		at, lost, err := waitWants(ctx, w, tw, sbsTimeout, wants, &q.commit)
		if err != nil {
			return fmt.Errorf("%s %d: %w\n%s", kind, i, err, logs())
		}
		if lost {
			r.lost++
			logf("%s mode N=%d: %s %d: a notification was lost (overflow); sample dropped", r.mode, r.n, kind, i)
			return nil
		}
		if r.latency[kind] == nil {
			r.latency[kind] = map[string][]time.Duration{}
		}
		for j, wt := range wants {
			r.latency[kind][wt.side] = append(r.latency[kind][wt.side], at[j].Sub(tw))
			r.samples = append(r.samples, sbsSample{kind: kind, side: wt.side, i: i, written: tw, d: at[j].Sub(tw)})
		}
		return nil
	}
	untimed := func(f func() error) error {
		if err := settle(ctx, w, &q, sbsGap, sbsWriteGap, 30*time.Second); err != nil {
			return err
		}
		err := f()
		q.write = time.Now()
		return err
	}
	logf("%s mode N=%d: %d creates, %d endpoint changes, %d deletes, each written %v after the last commit and %v after the last write", r.mode, r.n, count, count, count, sbsGap, sbsWriteGap)
	// The Services and their EndpointSlices are written first, all at once: what is timed is the
	// status write that gives each its ingress IP.
	err := untimed(func() (err error) {
		for i := range count {
			if objs[i], err = svcs.Create(ctx, lbService(name(i)), metav1.CreateOptions{}); err != nil {
				return err
			}
			if eps[i], err = slices.Create(ctx, changeSlice(name(i), nthAddr(sbsEPBase, i)), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range count {
		if err := timed("create", i, func() (err error) {
			objs[i], err = svcs.UpdateStatus(ctx, withIngress(objs[i], nthAddr(createBase, i)), metav1.UpdateOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	for i := range count {
		if err := timed("endpoints", i, func() (err error) {
			s := eps[i].DeepCopy()
			s.Endpoints[0].Addresses = []string{nthAddr(sbsEPMoved, i).String()}
			eps[i], err = slices.Update(ctx, s, metav1.UpdateOptions{})
			return err
		}); err != nil {
			return err
		}
	}
	for i := range count {
		if err := timed("delete", i, func() error {
			return svcs.Delete(ctx, objs[i].Name, metav1.DeleteOptions{})
		}); err != nil {
			return err
		}
	}
	// No garbage collector runs here: the EndpointSlices go after their Services, as they would.
	for i := range count {
		if err := slices.Delete(ctx, eps[i].Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// changeSlice is the EndpointSlice of a change Service: one ready endpoint on this node.
func changeSlice(svc string, ep netip.Addr) *discoveryv1.EndpointSlice {
	ready, node := true, sbsNode
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-ep", Namespace: namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "bench",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Protocol: new(corev1.ProtocolTCP), Port: new(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ep.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: new(false)},
			NodeName:   &node,
		}},
	}
}

// flagSet reports whether the named flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func (r *sbsResult) summary() string {
	s := fmt.Sprintf("kube-proxy %s mode + agent (%s) N=%d: kube-proxy synced after %v, agent after %v", r.mode, r.backend, r.n, ms(r.kpReady), ms(r.agentReady))
	for _, kind := range sbsKinds {
		for _, side := range []string{"kube-proxy", "agent"} {
			if l := r.latency[kind][side]; len(l) > 0 {
				s += fmt.Sprintf("; %s %s p50 %v p99 %v", kind, side, ms(pct(l, 50)), ms(pct(l, 99)))
			}
		}
	}
	return s + fmt.Sprintf("; lost %d, overflows %d", r.lost, r.overflows)
}

// agentMinSync is the agent's --min-sync-period in rs (one run gives every agent the same).
func agentMinSync(rs []*sbsResult) time.Duration {
	if len(rs) == 0 {
		return sbsMinSync
	}
	return rs[0].agentMinSync
}

// renderKubeProxy prints the side-by-side results as a markdown table.
func renderKubeProxy(m machine, version string, o options, rs []*sbsResult) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Run of %s on %s: %s CPUs (%s), kernel %s, %s, %s; kube-proxy %s.\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), host, m.nproc, m.cpu, m.kernel, m.iptables, m.nft, version)
	fmt.Fprintf(&b, "Load average (1/5/15 min) before: %s, after: %s.\n", m.loadBefore, m.loadAfter)
	fmt.Fprintf(&b, "Command: `go run ./bench %s`. Each change written %v after the last commit and %v after the last write (kube-proxy's min-sync-period %v, the agent's %v); time from the start of the API write to the arrival of the first notification of the nf_tables commit that added (removed) the change's address in that side's table.\n\n",
		strings.Join(os.Args[1:], " "), sbsGap, sbsWriteGap, sbsMinSync, agentMinSync(rs))
	b.WriteString("| kube-proxy mode | agent backend | N | change | samples | kube-proxy p50 | kube-proxy p99 | agent p50 | agent p99 | agent p99 ≤ kube-proxy p99 |\n")
	b.WriteString("|---|---|---:|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		for _, kind := range sbsKinds {
			kp, ag := r.latency[kind]["kube-proxy"], r.latency[kind]["agent"]
			if len(kp) == 0 {
				continue
			}
			agP50, agP99, cmp := "no rule (DNAT to the Cluster-IP)", "—", "—"
			if len(ag) > 0 {
				agP50, agP99 = ms(pct(ag, 50)).String(), ms(pct(ag, 99)).String()
				cmp = mark(pct(ag, 99) <= pct(kp, 99))
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %s | %d | %v | %v | %s | %s | %s |\n", r.mode, r.backend, r.n, kind, len(kp), ms(pct(kp, 50)), ms(pct(kp, 99)), agP50, agP99, cmp)
		}
	}
	b.WriteString("\n| kube-proxy mode | N | kube-proxy start → first sync done | agent start → all N entries (1 s polls) | peak RSS kube-proxy | peak RSS agent | samples lost (overflows) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %.1f MiB | %.1f MiB | %d (%d) |\n", r.mode, r.n, ms(r.kpReady), ms(r.agentReady), float64(r.kpHWM)/1024, float64(r.agHWM)/1024, r.lost, r.overflows)
	}
	return b.String()
}
