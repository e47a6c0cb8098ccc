package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// result holds one backend's figures at one N.
type result struct {
	backend string
	n       int
	run     int // 1.. (-runs)

	loadBefore, loadAfter string // load average around the measurement

	e2e       time.Duration // agent process start → the commit after which all N entries are in the kernel
	list      time.Duration // the agent's informer list/sync ("watches synced after")
	program   time.Duration // watches synced → that commit (compute + apply, as the kernel sees it)
	floor     time.Duration // one iptables-restore / nft -f of the same rules into a fresh namespace
	floorOne  time.Duration // one process adding one entry on top of that
	kernelObj int           // entries counted in the kernel at the end of the cold start

	latency   map[string][]time.Duration // create / update / delete, at the largest N only
	hwmKB     int64                      // VmHWM
	coldHWMKB int64                      // VmHWM once the cold start is over (before the changes)
	rssKB     int64                      // VmRSS at the end
	idleCPU   time.Duration              // utime+stime (+ children's) over idleWin
	idleWin   time.Duration
	overflows int // netlink overflows (lost notifications) during the run

	cgCold, cgEnd *cgFigures // the agent's memory cgroup after the cold start and at the end (nil: no cgroup)
}

// changeKinds are the changes measured, in the order measured (changes).
var changeKinds = []string{"create", "update", "delete"}

func (r *result) summary() string {
	s := fmt.Sprintf("%s N=%d: end to end %v (list %v, programming %v), floor %v (%.1fx), entries %d",
		r.backend, r.n, ms(r.e2e), ms(r.list), ms(r.program), ms(r.floor), ratio(r.program, r.floor), r.kernelObj)
	for _, kind := range changeKinds {
		if l := r.latency[kind]; len(l) > 0 {
			s += fmt.Sprintf("; %s p50 %v p99 %v max %v", kind, ms(pct(l, 50)), ms(pct(l, 99)), ms(pct(l, 100)))
		}
	}
	if r.hwmKB > 0 {
		s += fmt.Sprintf("; peak RSS %.1f MiB (%.1f MiB by the end of the cold start)", float64(r.hwmKB)/1024, float64(r.coldHWMKB)/1024)
	}
	if r.idleWin > 0 {
		s += fmt.Sprintf("; idle CPU %v over %v", ms(r.idleCPU), r.idleWin)
	}
	return s
}

func ms(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	if i < 0 {
		i = 0
	}
	return s[i]
}

// measure runs one agent with backend be against n Services in a fresh node namespace.
func measure(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, o options, be string, n, run int, full bool) (_ *result, err error) {
	r := &result{backend: be, n: n, run: run, latency: map[string][]time.Duration{}}
	k := kernelFor(be)
	ns := fmt.Sprintf("nnmb-%s-%d", be[:3], n)
	kc, done, err := nodeNamespace(ctx, cp, ns)
	if err != nil {
		return nil, err
	}
	defer done()
	w, err := newGenWatcher(netns.Path(ns))
	if err != nil {
		return nil, err
	}
	defer w.Close()

	logFile := fmt.Sprintf("%s/nnm-bench-%s-%d.log", os.TempDir(), be, n)
	_ = os.Remove(logFile)
	args := []string{
		"--kubeconfig", kc, "--node-name", "bench-node", "--backend", be, "--iptables-variant", "nft",
		"--proxy-mode", "ipvs", "--families", "ipv4", "--pod-cidrs", "10.244.0.0/24",
		"--disable-fix", "invalid-drop", "--min-sync-period", o.minSyncPeriod.String(), "--log-level", o.agentLogLevel,
	}
	cg, err := agentCgroup(o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cg != nil {
			_ = cg.remove()
		}
	}()
	t0 := time.Now()
	a, err := agenttest.Start(agenttest.Options{Netns: ns, Bin: o.agentBin, Args: args, Env: o.agentEnv, LogFile: logFile, Cgroup: cg.dir})
	if err != nil {
		return nil, err
	}
	defer a.Stop(agenttest.StopGrace)
	defer func() {
		if err != nil {
			if f := cg.figures(); f.oomKills > 0 {
				err = fmt.Errorf("%w (the memory cgroup OOM-killed %d process(es); peak %s; %v)", err, f.oomKills, mib(f.peak), f.atPeak)
			}
		}
	}()
	logf("%s N=%d: agent started (pid %d, log %s, cgroup %s %s)", be, n, a.PID(), logFile, cg.version(), cg.dir)

	// Cold start: the commit after which all n entries are in the kernel.
	at, err := waitCommit(ctx, w, t0, 5*time.Minute, func() (bool, error) {
		if err := a.Exited(); err != nil {
			return false, fmt.Errorf("agent exited: %w\n%s", err, a.LogTail(20))
		}
		got, err := k.entries(ctx, ns)
		r.kernelObj = got
		return got == n, err
	})
	if err != nil {
		return nil, fmt.Errorf("cold start: %w (kernel holds %d of %d entries)\n%s", err, r.kernelObj, n, a.LogTail(20))
	}
	r.e2e = at.Sub(t0)
	synced, list, err := watchesSynced(logFile)
	if err != nil {
		return nil, err
	}
	r.list, r.program = list, at.Sub(synced)
	profile := func(phase string) error {
		if o.profileDir == "" {
			return nil
		}
		return snapProfile(o.profileDir, a.PID(), fmt.Sprintf("heap-%s-%d-run%d-%s", be, n, run, phase))
	}
	if err := profile("cold"); err != nil {
		return nil, err
	}

	dump, err := k.dump(ctx, ns)
	if err != nil {
		return nil, err
	}
	if r.floor, r.floorOne, err = floor(k, dump, o.floorRuns); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}

	// The floor took seconds: the agent has long finished the cold start (record, first read-back).
	if r.coldHWMKB, _, err = memory(a.PID()); err != nil {
		return nil, err
	}
	cold := cg.figures()
	r.cgCold = &cold
	logf("%s N=%d: cold start: VmHWM %.1f MiB, cgroup %s peak %s (%v)", be, n, float64(r.coldHWMKB)/1024, cold.version, mib(cold.peak), cold.atPeak)
	if full {
		if err := changes(ctx, c, k, w, a, ns, o.changes, r); err != nil {
			return nil, err
		}
		if err := profile("changes"); err != nil {
			return nil, err
		}
		// Idle: no API changes; only the periodic resync (default --sync-period 30s) runs.
		time.Sleep(2 * time.Second)
		before, err := cpuTime(a.PID())
		if err != nil {
			return nil, err
		}
		logf("%s N=%d: idle CPU window %v", be, n, o.idle)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.idle):
		}
		after, err := cpuTime(a.PID())
		if err != nil {
			return nil, err
		}
		r.idleCPU, r.idleWin = after-before, o.idle
		if err := profile("idle"); err != nil {
			return nil, err
		}
	}
	r.hwmKB, r.rssKB, err = memory(a.PID())
	if err != nil {
		return nil, err
	}
	end := cg.figures()
	r.cgEnd = &end
	r.overflows = w.Overflows()
	if err := a.Stop(agenttest.StopGrace); err != nil {
		return nil, err
	}
	return r, nil
}

// nodeNamespace makes the node namespace ns afresh and connects it to the control plane; done
// disconnects and deletes it.
func nodeNamespace(ctx context.Context, cp *controlplane.ControlPlane, ns string) (kubeconfig string, done func(), err error) {
	_ = netns.Delete(ctx, ns)
	if err := netns.Create(ctx, ns); err != nil {
		return "", nil, err
	}
	kc, err := cp.ConnectNamespace(ns)
	if err != nil {
		_ = netns.Delete(context.Background(), ns)
		return "", nil, err
	}
	return kc, func() {
		_ = cp.DisconnectNamespace(ns)
		_ = netns.Delete(context.Background(), ns)
	}, nil
}

// slowChange is the change latency above which the benchmark logs the change (the target is a p99
// of 50 ms).
const slowChange = 40 * time.Millisecond

// changes measures create, update and delete of one Service at a time: from the start of the API
// write to the nf_tables commit after which the kernel shows the change.
func changes(ctx context.Context, c *cluster, k kernel, w *genWatcher, a *agenttest.Agent, ns string, count int, r *result) error {
	svcs := c.client.CoreV1().Services(namespace)
	objs := make([]*corev1.Service, count)
	const gap = 100 * time.Millisecond
	measureOne := func(kind string, i int, write func() error, cond func() (bool, error)) error {
		time.Sleep(gap)
		w.drain()
		// Timed from the start of the API write: the agent sees the change through its watch as
		// the apiserver answers the write, and often commits before the answer has reached us (a
		// commit before "write returned" was once discarded as stale, and the 1 s re-check then
		// charged about a second: the unexplained 1.1-1.6 s delete maxima of the first issue-10
		// runs). So every figure includes the write's own round trip: an upper bound.
		tw := time.Now()
		if err := write(); err != nil {
			return fmt.Errorf("%s %d: %w", kind, i, err)
		}
		at, err := waitCommit(ctx, w, tw, 30*time.Second, cond)
		if err != nil {
			return fmt.Errorf("%s %d: %w\n%s", kind, i, err, a.LogTail(20))
		}
		r.latency[kind] = append(r.latency[kind], at.Sub(tw))
		if d := at.Sub(tw); d > slowChange {
			// Named with its time, to be found in the agent's log (-agent-log-level debug).
			logf("%s N=%d: %s %d took %v (written at %s)", r.backend, r.n, kind, i, d.Round(time.Millisecond), tw.UTC().Format("15:04:05.000"))
		}
		return nil
	}
	has := func(ip netip.Addr, want bool) func() (bool, error) {
		return func() (bool, error) {
			got, err := k.has(ctx, ns, ip)
			return got == want, err
		}
	}
	logf("%s N=%d: %d creates", r.backend, r.n, count)
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("chg-%04d", i)
		// The Service is created first; its ingress IP arrives with a status write, as a load
		// balancer controller would set it. The status write is the one timed (the create alone
		// changes no rule).
		svc, err := svcs.Create(ctx, lbService(name), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		ip := nthAddr(createBase, i)
		if err := measureOne("create", i, func() error {
			objs[i], err = svcs.UpdateStatus(ctx, withIngress(svc, ip), metav1.UpdateOptions{})
			return err
		}, has(ip, true)); err != nil {
			return err
		}
	}
	logf("%s N=%d: %d ingress IP updates", r.backend, r.n, count)
	for i := 0; i < count; i++ {
		old, ip := nthAddr(createBase, i), nthAddr(updateBase, i)
		if err := measureOne("update", i, func() error {
			var err error
			objs[i], err = svcs.UpdateStatus(ctx, withIngress(objs[i], ip), metav1.UpdateOptions{})
			return err
		}, func() (bool, error) {
			if ok, err := has(ip, true)(); !ok || err != nil {
				return ok, err
			}
			return has(old, false)()
		}); err != nil {
			return err
		}
	}
	logf("%s N=%d: %d deletes", r.backend, r.n, count)
	for i := 0; i < count; i++ {
		if err := measureOne("delete", i, func() error {
			return svcs.Delete(ctx, objs[i].Name, metav1.DeleteOptions{})
		}, has(nthAddr(updateBase, i), false)); err != nil {
			return err
		}
	}
	// The scale Services are all still there.
	got, err := k.entries(ctx, ns)
	if err != nil {
		return err
	}
	if got != r.n {
		return fmt.Errorf("after the changes the kernel holds %d entries, want %d", got, r.n)
	}
	return nil
}

// watchesSynced finds the agent's "watches synced" log line: when, and after how long.
func watchesSynced(logFile string) (time.Time, time.Duration, error) {
	f, err := os.Open(logFile)
	if err != nil {
		return time.Time{}, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		if !strings.Contains(l, `msg="watches synced"`) {
			continue
		}
		var at time.Time
		var after time.Duration
		for _, field := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(field, "time="); ok {
				at, err = time.Parse(time.RFC3339Nano, v)
				if err != nil {
					return time.Time{}, 0, fmt.Errorf("parse %q: %w", l, err)
				}
			}
			if v, ok := strings.CutPrefix(field, "after="); ok {
				after, err = time.ParseDuration(v)
				if err != nil {
					return time.Time{}, 0, fmt.Errorf("parse %q: %w", l, err)
				}
			}
		}
		return at, after, nil
	}
	return time.Time{}, 0, fmt.Errorf("no \"watches synced\" line in %s (agent built before that log line? run make build)", logFile)
}

// memory returns VmHWM and VmRSS in kB.
func memory(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = v
		case "VmRSS:":
			rss = v
		}
	}
	return hwm, rss, nil
}

// cpuTime is utime+stime of a process plus cutime+cstime of the children it waited for (the
// iptables-save / nft processes it runs).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	// Fields after the command: state(3) ... utime(14) stime(15); f[0] is field 3.
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	cut, _ := strconv.ParseInt(f[13], 10, 64)
	cst, _ := strconv.ParseInt(f[14], 10, 64)
	const hz = 100 // USER_HZ
	return time.Duration(ut+st+cut+cst) * time.Second / hz, nil
}
