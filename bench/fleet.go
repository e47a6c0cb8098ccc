package main

// The fleet benchmark (issue #42): what the agent's watches cost the API server when many nodes'
// agents start at once (a DaemonSet rollout: maxUnavailable 10% of 5,000 nodes restarts 500), beside
// kube-proxy's watches and a plain LIST on the same apiserver, and what an apiserver restart costs
// with them running.
//
//	go run ./bench -fleet 50,200 -fleet-n 10000 -fleet-restart 50 -fleet-outage 50
//
// Every phase gets a freshly started kube-apiserver (etcd keeps the Services), so one phase's heap
// does not hide the next one's growth, then waits for the machine and the apiserver's RSS to settle.
// The K members run in one child process (fleetchild.go), each with its own client, transport and
// TCP connection. Measured per phase: the apiserver's RSS (VmRSS sampled every 25 ms and VmHWM, reset
// before the phase) and CPU time from /proc/<pid>, over its value before the phase; the bytes the
// members read from their TCP connections; request attempts by class, 429s at the members and the
// apiserver's own count; how long until every member's caches hold their first list.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

type fleetOptions struct {
	ks       []int
	n        int
	kinds    []string
	restartK int // K of the apiserver-restart phase (0: none)
	outageK  int // K of the start-during-an-outage phase (0: none)
	// outageBefore is another build of the bench (e.g. of the commit before a fix) whose child runs
	// the outage phase first, beside this build's.
	outageBefore string
	// only limits a kind to some of the Ks (-fleet-kinds kube-proxy@50).
	only     map[string][]int
	downtime time.Duration // how long the apiserver is down in those phases
	// conditionsK: the Node conditions' phases with this many agents (0: none; conditions.go).
	conditionsK int
	out         string
}

// fleetRow is one phase's result.
type fleetRow struct {
	kind string
	k    int
	ev   fleetEvent
	// apiserver, over its value before the phase
	rss0, peakKB, steadyKB int64
	cpu                    float64 // seconds
	rejected, server429    float64 // apiserver_flowcontrol_rejected_requests_total, apiserver_request_total{code="429"}
}

func runFleet(ctx context.Context, fo fleetOptions) error {
	machine := describeMachine()
	logf("machine: %s", machine.oneLine())
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceNodePortRange: scaleNodePortRange})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer cp.Close()
	c, err := newCluster(cp)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.seedServices(ctx, fo.n); err != nil {
		return err
	}
	logf("%d LoadBalancer Services exist (%v)", fo.n, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	if err := c.seedEndpointSlices(ctx, fo.n); err != nil {
		return err
	}
	logf("%d EndpointSlices exist, %d ready endpoints each (%v)", fo.n, endpointsPerSlice, time.Since(t0).Round(time.Millisecond))
	if err := fleetIdentities(ctx, cp); err != nil {
		return err
	}

	var rows []*fleetRow
	for _, kind := range fo.kinds {
		for _, k := range fo.ks {
			if ks, ok := fo.only[kind]; ok && !slices.Contains(ks, k) {
				continue
			}
			r, err := fleetStartPhase(ctx, cp, c, fo, kind, k)
			if err != nil {
				return fmt.Errorf("%s K=%d: %w", kind, k, err)
			}
			logf("%s", r.summary())
			rows = append(rows, r)
		}
	}
	var restarts []*restartRow
	if fo.restartK > 0 {
		for _, kind := range []string{"agent", "kube-proxy"} {
			r, err := fleetRestartPhase(ctx, cp, c, fo, kind, fo.restartK)
			if err != nil {
				return fmt.Errorf("restart, %s K=%d: %w", kind, fo.restartK, err)
			}
			logf("%s", r.summary())
			restarts = append(restarts, r)
		}
	}
	var outages []*outageRow
	if fo.outageK > 0 {
		bins := []string{""}
		if fo.outageBefore != "" {
			bins = []string{fo.outageBefore, ""}
		}
		for _, bin := range bins {
			outage, err := fleetOutagePhase(ctx, cp, c, fo, "agent", fo.outageK, bin)
			if err != nil {
				return fmt.Errorf("outage, K=%d: %w", fo.outageK, err)
			}
			logf("%s", outage.summary())
			outages = append(outages, outage)
		}
	}
	var conds []conditionsRow
	if fo.conditionsK > 0 {
		if conds, err = runConditions(ctx, cp, fo.conditionsK); err != nil {
			return err
		}
	}
	machine.loadAfter = loadAvg()
	table := renderFleet(machine, fo, rows, restarts, outages)
	if len(conds) > 0 {
		table += renderConditions(fo.conditionsK, conds)
	}
	fmt.Println()
	fmt.Println(table)
	if fo.out != "" {
		return os.WriteFile(fo.out, []byte(table), 0o644)
	}
	return nil
}

// fleetIdentities gives the members' ServiceAccounts their roles: the agent's RBAC from deploy/base
// (applied as the install applies it), kube-proxy's binding to system:node-proxier (as kubeadm binds
// it).
func fleetIdentities(ctx context.Context, cp *controlplane.ControlPlane) error {
	files, err := agenttest.DeployBaseFiles()
	if err != nil {
		return err
	}
	if err := agenttest.ApplyManifests(ctx, cp.AdminRESTConfig(), files, nil); err != nil {
		return fmt.Errorf("the agent's RBAC: %w", err)
	}
	_, err = cp.AdminClient().RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-bench-kube-proxy"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "kube-proxy", Namespace: metav1.NamespaceSystem}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kube-proxy's binding: %w", err)
	}
	return nil
}

// freshAPIServer restarts kube-apiserver, waits until it lists the n Services and its RSS and the
// machine settle; it returns the apiserver's pid and its settled RSS.
func freshAPIServer(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, n int) (int, int64, error) {
	if cp.APIServerPID() != 0 {
		if err := cp.StopAPIServer(); err != nil {
			return 0, 0, err
		}
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		return 0, 0, err
	}
	if err := c.waitListed(ctx, n); err != nil {
		return 0, 0, err
	}
	pid := cp.APIServerPID()
	// Settle: the machine quiet, and the RSS moving less than 1% over 2 s (at most 40 s).
	if _, _, err := waitQuiet(ctx); err != nil {
		return 0, 0, err
	}
	prev := procStatusKB(pid, "VmRSS")
	for i := 0; i < 20; i++ {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(2 * time.Second):
		}
		cur := procStatusKB(pid, "VmRSS")
		if d := cur - prev; d*100 < prev && -d*100 < prev {
			return pid, cur, nil
		}
		prev = cur
	}
	return pid, prev, nil
}

// rssSampler samples a process's VmRSS every 25 ms, keeping the largest.
type rssSampler struct {
	peak atomic64
	stop chan struct{}
	done chan struct{}
}

type atomic64 struct {
	mu sync.Mutex
	v  int64
}

func (a *atomic64) max(v int64) {
	a.mu.Lock()
	a.v = max(a.v, v)
	a.mu.Unlock()
}

func (a *atomic64) get() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.v
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	// VmHWM from here on: writing 5 to clear_refs resets it (proc(5)).
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	go func() {
		defer close(s.done)
		t := time.NewTicker(25 * time.Millisecond)
		defer t.Stop()
		for {
			s.peak.max(procStatusKB(pid, "VmRSS"))
			select {
			case <-s.stop:
				s.peak.max(procStatusKB(pid, "VmHWM"))
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) finish() int64 {
	close(s.stop)
	<-s.done
	return s.peak.get()
}

// procCPU is a process's user + system CPU time.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// apiserverCounters returns the apiserver's 429 counters (flow control's rejections, requests
// answered 429), summed over their labels.
func apiserverCounters(ctx context.Context, c *cluster) (rejected, tooMany float64) {
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return -1, -1
	}
	for _, l := range strings.Split(string(raw), "\n") {
		name, rest, ok := strings.Cut(l, "{")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case name == "apiserver_flowcontrol_rejected_requests_total":
			rejected += v
		case name == "apiserver_request_total" && strings.Contains(rest, `code="429"`):
			tooMany += v
		}
	}
	return rejected, tooMany
}

// fleetChildProc is a running fleet child.
type fleetChildProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan fleetEvent
	err    chan error
}

func startFleetChild(ctx context.Context, spec fleetSpec) (*fleetChildProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if spec.Bin != "" {
		self = spec.Bin
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &fleetChildProc{cmd: cmd, stdin: stdin, events: make(chan fleetEvent, 8), err: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e fleetEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				logf("fleet child said %q", sc.Text())
				continue
			}
			p.events <- e
		}
		close(p.events)
		p.err <- cmd.Wait()
	}()
	return p, nil
}

func (p *fleetChildProc) send(cmd string) error {
	_, err := fmt.Fprintln(p.stdin, cmd)
	return err
}

// next waits for the child's next event.
func (p *fleetChildProc) next(ctx context.Context, timeout time.Duration) (fleetEvent, error) {
	select {
	case e, ok := <-p.events:
		if !ok {
			return fleetEvent{}, fmt.Errorf("fleet child ended: %v", <-p.err)
		}
		if e.Err != "" {
			return e, errors.New(e.Err)
		}
		return e, nil
	case <-time.After(timeout):
		return fleetEvent{}, fmt.Errorf("no answer from the fleet child in %v", timeout)
	case <-ctx.Done():
		return fleetEvent{}, ctx.Err()
	}
}

// quit ends the child and waits for it.
func (p *fleetChildProc) quit() {
	_ = p.send("quit")
	_ = p.stdin.Close()
	for range p.events {
	}
	select {
	case <-p.err:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
	}
}

func fleetStartPhase(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, fo fleetOptions, kind string, k int) (*fleetRow, error) {
	pid, rss0, err := freshAPIServer(ctx, cp, c, fo.n)
	if err != nil {
		return nil, err
	}
	logf("%s K=%d: apiserver (pid %d) settled at %s", kind, k, pid, mibKB(rss0))
	rej0, tm0 := apiserverCounters(ctx, c)
	cpu0 := procCPU(pid)
	s := sampleRSS(pid)
	child, err := startFleetChild(ctx, fleetSpec{Kind: kind, K: k, Kubeconfig: cp.AdminKubeconfig()})
	if err != nil {
		s.finish()
		return nil, err
	}
	defer child.quit()
	ev, err := child.next(ctx, 11*time.Minute)
	if err != nil {
		s.finish()
		return nil, err
	}
	// The held watches' memory, once the first lists are over.
	time.Sleep(2 * time.Second)
	steady := procStatusKB(pid, "VmRSS")
	peak := s.finish()
	r := &fleetRow{kind: kind, k: k, ev: ev, rss0: rss0, peakKB: peak - rss0, steadyKB: steady - rss0, cpu: procCPU(pid) - cpu0}
	rej1, tm1 := apiserverCounters(ctx, c)
	r.rejected, r.server429 = rej1-rej0, tm1-tm0
	return r, nil
}

func (r *fleetRow) summary() string {
	return fmt.Sprintf("%s K=%d: %d/%d synced (p50 %.1fs, last %.1fs, fewest Services %d); apiserver peak +%s (%s/start), steady +%s, CPU %.1fs; received %s (%s/start); requests %v; 429s %d (apiserver: %.0f rejected, %.0f answered 429); child peak RSS %s, CPU %.1fs",
		r.kind, r.k, r.ev.Synced, r.k, r.ev.SyncP50, r.ev.SyncMax, r.ev.MinObjects, mibKB(r.peakKB), mibKB(r.peakKB/int64(r.k)), mibKB(r.steadyKB), r.cpu,
		mibB(r.ev.BytesIn), mibB(r.ev.BytesIn/int64(r.k)), r.ev.Requests, r.ev.Status429, r.rejected, r.server429, mibKB(r.ev.ChildHWMkB), r.ev.ChildCPU)
}

// restartRow is the apiserver-restart phase: K members synced, the apiserver stopped for downtime
// and started again.
type restartRow struct {
	kind     string
	k        int
	downtime time.Duration
	ev       fleetEvent // since the stop: requests, retries, the marker's arrival after ready
	rss0     int64      // the fresh apiserver's settled RSS without members
	peakKB   int64      // the restarted apiserver's peak RSS, over rss0
}

func fleetRestartPhase(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, fo fleetOptions, kind string, k int) (*restartRow, error) {
	_, rss0, err := freshAPIServer(ctx, cp, c, fo.n)
	if err != nil {
		return nil, err
	}
	child, err := startFleetChild(ctx, fleetSpec{Kind: kind, K: k, Kubeconfig: cp.AdminKubeconfig()})
	if err != nil {
		return nil, err
	}
	defer child.quit()
	ev, err := child.next(ctx, 11*time.Minute)
	if err != nil {
		return nil, err
	}
	if ev.Synced != k {
		return nil, fmt.Errorf("only %d of %d synced before the restart", ev.Synced, k)
	}
	time.Sleep(2 * time.Second)
	if err := child.send("mark"); err != nil {
		return nil, err
	}
	logf("restart, %s K=%d: stopping kube-apiserver for %v", kind, k, fo.downtime)
	if err := cp.StopAPIServer(); err != nil {
		return nil, err
	}
	time.Sleep(fo.downtime)
	if err := cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	ready := time.Now()
	s := sampleRSS(cp.APIServerPID())
	name := fmt.Sprintf("fleet-marker-%d", ready.UnixNano())
	err = retry(ctx, func() error {
		_, err := c.client.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		s.finish()
		return nil, fmt.Errorf("marker Service: %w", err)
	}
	if err := child.send(fmt.Sprintf("marker %s/%s %d", namespace, name, ready.UnixMilli())); err != nil {
		s.finish()
		return nil, err
	}
	ev, err = child.next(ctx, 6*time.Minute)
	time.Sleep(time.Second)
	peak := s.finish()
	_ = c.client.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil {
		return nil, err
	}
	return &restartRow{kind: kind, k: k, downtime: fo.downtime, ev: ev, rss0: rss0, peakKB: peak - rss0}, nil
}

func (r *restartRow) relists() int { return r.ev.Requests["list"] + r.ev.Requests["watchlist"] }

func (r *restartRow) summary() string {
	return fmt.Sprintf("restart, %s K=%d (down %v): marker in every cache %d/%d, p50 %.2fs, last %.2fs after ready; relists %d (%.2f per informer), watch resumes %d, requests %v, 429s %d, no answer %d, attempts per 100 ms: max %d, p99 %d, by class %v; retries %d, per 100 ms max %d, by class %v; restarted apiserver peak +%s over the fresh one",
		r.kind, r.k, r.downtime, r.ev.MarkerSeen, r.k, r.ev.MarkerP50, r.ev.MarkerMax, r.relists(), float64(r.relists())/float64(r.k*r.ev.Informers),
		r.ev.Requests["watch"], r.ev.Requests, r.ev.Status429, r.ev.ConnErrors, r.ev.MaxPer100ms, r.ev.P99Per100ms, r.ev.MaxBucketBy,
		r.ev.Retries, r.ev.MaxRetryPer100ms, r.ev.RetryBucketBy, mibKB(r.peakKB))
}

// outageRow is K members started while the apiserver is down (a rollout, or nodes rebooting,
// during an outage): how their retries bunch, and how long after the apiserver is back all sync.
type outageRow struct {
	kind     string
	k        int
	downtime time.Duration
	ev       fleetEvent
	syncedIn time.Duration // from the apiserver ready to every member synced
	bin      string        // the child's build ("": this one)
}

func fleetOutagePhase(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, fo fleetOptions, kind string, k int, bin string) (*outageRow, error) {
	if _, _, err := freshAPIServer(ctx, cp, c, fo.n); err != nil {
		return nil, err
	}
	if err := cp.StopAPIServer(); err != nil {
		return nil, err
	}
	child, err := startFleetChild(ctx, fleetSpec{Kind: kind, K: k, Kubeconfig: cp.AdminKubeconfig(), Bin: bin})
	if err != nil {
		return nil, err
	}
	defer child.quit()
	time.Sleep(fo.downtime)
	if err := cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	ready := time.Now()
	ev, err := child.next(ctx, 11*time.Minute)
	if err != nil {
		return nil, err
	}
	return &outageRow{kind: kind, k: k, downtime: fo.downtime, ev: ev, syncedIn: time.Since(ready), bin: bin}, nil
}

func (r *outageRow) summary() string {
	who := "this build"
	if r.bin != "" {
		who = r.bin
	}
	return fmt.Sprintf("outage (%s), %s K=%d started with the apiserver down for %v: %d/%d synced %.1fs after it was ready; requests %v, no answer %d, attempts per 100 ms: max %d, p99 %d, by class %v; retries %d, per 100 ms max %d, by class %v",
		who, r.kind, r.k, r.downtime, r.ev.Synced, r.k, r.syncedIn.Seconds(), r.ev.Requests, r.ev.ConnErrors, r.ev.MaxPer100ms, r.ev.P99Per100ms, r.ev.MaxBucketBy,
		r.ev.Retries, r.ev.MaxRetryPer100ms, r.ev.RetryBucketBy)
}

func mibKB(kb int64) string { return fmt.Sprintf("%.1f MiB", float64(kb)/1024) }
func mibB(b int64) string   { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func renderFleet(m machine, fo fleetOptions, rows []*fleetRow, restarts []*restartRow, outages []*outageRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d LoadBalancer Services; %s CPUs (%s), load average %s before, %s after.\n\n", fo.n, m.nproc, m.cpu, m.loadBefore, m.loadAfter)
	b.WriteString("| watcher | K | synced | all synced after | apiserver peak RSS per start | held per start | apiserver CPU per start | received per start | requests per start | 429s |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		var reqs int
		for _, n := range r.ev.Requests {
			reqs += n
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f s | %.2f MiB | %.2f MiB | %.0f ms | %.2f MiB | %.1f | %d |\n",
			r.kind, r.k, r.ev.Synced, r.ev.SyncMax, float64(r.peakKB)/1024/float64(r.k), float64(r.steadyKB)/1024/float64(r.k),
			1000*r.cpu/float64(r.k), float64(r.ev.BytesIn)/(1<<20)/float64(r.k), float64(reqs)/float64(r.k), r.ev.Status429)
	}
	if len(restarts) > 0 {
		b.WriteString("\nkube-apiserver restarted under K synced watchers:\n\n")
		b.WriteString("| watcher | K | down | relists per informer | watch resumes | no answer | retries | busiest 100 ms of retries | 429s | marker in every cache after ready (p50 / last) |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range restarts {
			fmt.Fprintf(&b, "| %s | %d | %v | %.2f | %d | %d | %d | %d | %d | %.2f s / %.2f s |\n", r.kind, r.k, r.downtime,
				float64(r.relists())/float64(r.k*r.ev.Informers), r.ev.Requests["watch"], r.ev.ConnErrors, r.ev.Retries, r.ev.MaxRetryPer100ms,
				r.ev.Status429, r.ev.MarkerP50, r.ev.MarkerMax)
		}
	}
	if len(outages) > 0 {
		b.WriteString("\nK agents started while kube-apiserver was down:\n\n")
		b.WriteString("| build | K | down | retries | busiest 100 ms of retries | of discovery | of watches | all synced after ready |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, o := range outages {
			who := "this build"
			if o.bin != "" {
				who = "-fleet-outage-before"
			}
			fmt.Fprintf(&b, "| %s | %d | %v | %d | %d | %d | %d | %.1f s |\n", who, o.k, o.downtime, o.ev.Retries, o.ev.MaxRetryPer100ms,
				o.ev.RetryBucketBy["discovery"], max(o.ev.RetryBucketBy["watchlist"], o.ev.RetryBucketBy["watch"], o.ev.RetryBucketBy["list"]), o.syncedIn.Seconds())
		}
	}
	return b.String()
}
