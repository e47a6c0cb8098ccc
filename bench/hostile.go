package main

// The hostile-Services memory run of issue #41 row 2: one tenant's LoadBalancer Services with tens
// of thousands of ports each (the API accepts them), against the real apiserver, with the agent
// under the DaemonSet's settings (-manifest: GOMEMLIMIT and the memory limit of
// deploy/base/daemonset.yaml). It measures the agent's peak RSS (VmHWM) through the cold start and an
// update of every hostile Service, and how long invalid-drop, which reads nothing from the API,
// takes to be in the kernel in both families beside it.
//
//	go run ./bench -hostile 4x30000,12x5000 -manifest -backends iptables,nftables -runs 3

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// Ingress IPs of the hostile Services: 172.20.0.0 + k + 1 for the k-th Service (first address),
// updated to 172.21.0.0 + k + 1.
var (
	hostileBase   = netip.MustParseAddr("172.20.0.0")
	hostileUpdate = netip.MustParseAddr("172.21.0.0")
)

// hostileSvc is one hostile Service: its namespace, name and number of ports.
type hostileSvc struct {
	ns, name string
	ports    int
}

// parseHostile reads "<services>x<ports>[,<services>x<ports>...]": the first group's Services are
// all in namespace "tenant" (one tenant's: what the per-Service and per-namespace budgets meet),
// every Service of a later group in a namespace of its own, "tenant-<group>-<i>" (what only the
// per-fix budget meets).
func parseHostile(spec string) ([]hostileSvc, error) {
	var out []hostileSvc
	for g, s := range strings.Split(spec, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(s), "x")
		services, err := strconv.Atoi(a)
		ports, err2 := strconv.Atoi(b)
		if !ok || err != nil || err2 != nil || services <= 0 || ports <= 0 || ports > 65535 {
			return nil, fmt.Errorf("-hostile %q: want <services>x<ports>[,...], e.g. 4x30000,12x5000", spec)
		}
		for i := range services {
			ns := "tenant"
			if g > 0 {
				ns = fmt.Sprintf("tenant-%d-%d", g, i)
			}
			out = append(out, hostileSvc{ns: ns, name: fmt.Sprintf("hostile-%d-%d", g, i), ports: ports})
		}
	}
	return out, nil
}

func (h hostileSvc) object() *corev1.Service {
	svc := lbService(h.name)
	svc.Namespace = h.ns
	svc.Spec.Ports = make([]corev1.ServicePort, h.ports)
	for p := range h.ports {
		svc.Spec.Ports[p] = corev1.ServicePort{Name: "p" + strconv.Itoa(p+1), Protocol: corev1.ProtocolTCP,
			Port: int32(p + 1), TargetPort: intstr.FromInt32(int32(p + 1))}
	}
	return svc
}

// createHostile creates the Services, the k-th with ingress IP base + k + 1.
func (c *cluster) createHostile(ctx context.Context, hs []hostileSvc, base netip.Addr) error {
	for k, h := range hs {
		_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		svcs := c.client.CoreV1().Services(h.ns)
		err = retry(ctx, func() error {
			_, err := svcs.Create(ctx, h.object(), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("create %s/%s: %w", h.ns, h.name, err)
		}
		if err := c.setHostileIngress(ctx, h, nthAddr(base, k)); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) setHostileIngress(ctx context.Context, h hostileSvc, ip netip.Addr) error {
	svcs := c.client.CoreV1().Services(h.ns)
	return retry(ctx, func() error {
		cur, err := svcs.Get(ctx, h.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = svcs.UpdateStatus(ctx, withIngress(cur, ip), metav1.UpdateOptions{})
		return err
	})
}

type hostileResult struct {
	backend            string
	run                int
	dropBoth           time.Duration // start → invalid-drop in the kernel, both families
	extipDone          time.Duration // start → the DNAT fix's first sync (or its skip) reported
	entries            float64       // DNAT entries programmed (ipv4)
	skipped            string        // nnm_fix_objects_skipped of the DNAT fix
	coldHWM, updateHWM int64         // kB
	updateTook         time.Duration
	cgCold, cgEnd      cgFigures // the agent's memory cgroup (cgroup.go)
}

// runHostile runs the hostile-Services measurement.
func runHostile(ctx context.Context, o options, spec string) error {
	hs, err := parseHostile(spec)
	if err != nil {
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer cp.Close()
	c, err := newCluster(cp)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.createHostile(ctx, hs, hostileBase); err != nil {
		return err
	}
	logf("hostile Services %s created (%v)", spec, time.Since(t0).Round(time.Millisecond))
	var rs []*hostileResult
	for run := 1; run <= o.runs; run++ {
		for _, be := range o.backends {
			r, err := measureHostile(ctx, cp, c, o, be, run, hs)
			if err != nil {
				return fmt.Errorf("%s run %d: %w", be, run, err)
			}
			rs = append(rs, r)
		}
	}
	var b strings.Builder
	limit := "no limit"
	if o.manifest != nil {
		limit = o.manifest.limit.String()
	}
	fmt.Fprintf(&b, "hostile Services %s (Services x TCP ports; the first group in one namespace, the others one namespace each), one ingress IPv4 each; agent env %s; memory limit %s\n\n", spec, envText(o.agentEnv), limit)
	b.WriteString("| backend | run | invalid-drop in the kernel (both families) | DNAT fix synced | DNAT entries | skipped | peak RSS cold | peak RSS after update | cgroup peak cold | cgroup peak after update | spare under the limit (cgroup) | OOM kills | update applied |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %.0f | %s | %.1f MiB | %.1f MiB | %s | %s | %s | %d | %v |\n", r.backend, r.run,
			r.dropBoth.Round(time.Millisecond), r.extipDone.Round(time.Millisecond), r.entries, r.skipped,
			float64(r.coldHWM)/1024, float64(r.updateHWM)/1024, mib(r.cgCold.peak), mib(r.cgEnd.peak), spare(o, r.cgEnd.peak), r.cgEnd.oomKills, r.updateTook.Round(time.Millisecond))
	}
	b.WriteString("\nBreakdown of the agent's memory cgroup at its peak (the 50 ms sample with the highest usage):\n\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "- %s run %d (cgroup %s): %v\n", r.backend, r.run, r.cgEnd.version, r.cgEnd.atPeak)
	}
	fmt.Println()
	fmt.Println(b.String())
	if o.out != "" {
		return os.WriteFile(o.out, []byte(b.String()), 0o644)
	}
	return nil
}

func measureHostile(ctx context.Context, cp *controlplane.ControlPlane, c *cluster, o options, be string, run int, hs []hostileSvc) (_ *hostileResult, err error) {
	r := &hostileResult{backend: be, run: run}
	kc, done, err := nodeNamespace(ctx, cp, fmt.Sprintf("nnmh-%s-%d", be[:3], run))
	if err != nil {
		return nil, err
	}
	defer done()
	ns := fmt.Sprintf("nnmh-%s-%d", be[:3], run)
	if _, _, err := waitQuiet(ctx); err != nil {
		return nil, err
	}
	args := []string{"--kubeconfig", kc, "--node-name", "bench-node", "--backend", be, "--iptables-variant", "nft",
		"--proxy-mode", "ipvs", "--pod-cidrs", "10.244.0.0/24,fd00:10:244::/64", "--log-level", o.agentLogLevel}
	cg, err := agentCgroup(o)
	if err != nil {
		return nil, err
	}
	defer func() { _ = cg.remove() }()
	t0 := time.Now()
	a, err := agenttest.Start(agenttest.Options{Netns: ns, Bin: o.agentBin, Args: args, Env: o.agentEnv, Cgroup: cg.dir})
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
	var dropDone, extDone bool
	deadline := time.Now().Add(20 * time.Minute)
	for !(dropDone && extDone) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not done after 20 minutes (invalid-drop %v, DNAT fix %v)\n%s", dropDone, extDone, a.LogTail(20))
		}
		if err := a.Exited(); err != nil {
			return nil, fmt.Errorf("agent exited: %w\n%s", err, a.LogTail(20))
		}
		// A fix's last-success timestamp is set once every family of it synced.
		m, err := a.Metrics(ctx)
		if err == nil && !dropDone {
			if v, ok := m.Value("nnm_last_successful_sync_timestamp_seconds", "fix", "invalid-drop"); ok && v > 0 {
				dropDone, r.dropBoth = true, time.Since(t0)
			}
		}
		if !extDone {
			if err == nil {
				if v, ok := m.Value("nnm_last_successful_sync_timestamp_seconds", "fix", "ipvs-externalip-dnat"); ok && v > 0 {
					extDone, r.extipDone = true, time.Since(t0)
					r.entries, _ = m.Value("nnm_ipvs_externalip_dnat_ips", "family", "ipv4")
					if v, ok := m.Value("nnm_rules_programmed", "fix", "ipvs-externalip-dnat", "backend", be, "family", "ipv4"); ok {
						r.entries = v
					}
					var skips []string
					for _, s := range m.Find("nnm_fix_objects_skipped", "fix", "ipvs-externalip-dnat") {
						skips = append(skips, s.String())
					}
					r.skipped = strings.Join(skips, "; ")
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the read-back after the cold start
	if r.coldHWM, _, err = memory(a.PID()); err != nil {
		return nil, err
	}
	r.cgCold = cg.figures()
	profile := func(phase string) error {
		if o.profileDir == "" {
			return nil
		}
		return snapProfile(o.profileDir, a.PID(), fmt.Sprintf("heap-hostile-%s-run%d-%s", be, run, phase))
	}
	if err := profile("cold"); err != nil {
		return nil, err
	}
	logf("%s run %d: invalid-drop %v, DNAT fix %v, cold peak %.1f MiB, cgroup peak %s (%v)", be, run, r.dropBoth.Round(time.Millisecond), r.extipDone.Round(time.Millisecond), float64(r.coldHWM)/1024, mib(r.cgCold.peak), r.cgCold.atPeak)

	// Every hostile Service changes its ingress IP: to the other set of addresses than the one
	// the previous measurement left (by run alone, the second backend of a run would "update" the
	// Services to the addresses they already have, and measure no change).
	m0, _ := a.Metrics(ctx)
	before := m0.Sum("nnm_syncs_total", "fix", "ipvs-externalip-dnat")
	t1 := time.Now()
	base := hostileUpdate
	if c.hostileUpdates%2 == 1 {
		base = hostileBase
	}
	c.hostileUpdates++
	for k, h := range hs {
		if err := c.setHostileIngress(ctx, h, nthAddr(base, k)); err != nil {
			return nil, err
		}
	}
	if err := agenttest.Poll(ctx, 20*time.Minute, 100*time.Millisecond, func() error {
		if err := a.Exited(); err != nil {
			return agenttest.Permanent(fmt.Errorf("agent exited: %w\n%s", err, a.LogTail(20)))
		}
		m, err := a.Metrics(ctx)
		if err != nil {
			return err
		}
		if m.Sum("nnm_syncs_total", "fix", "ipvs-externalip-dnat") < before+2 {
			return fmt.Errorf("no sync of the DNAT fix since the update")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	time.Sleep(5 * time.Second) // later syncs of the same burst
	r.updateTook = time.Since(t1)
	if r.updateHWM, _, err = memory(a.PID()); err != nil {
		return nil, err
	}
	r.cgEnd = cg.figures()
	if err := profile("update"); err != nil {
		return nil, err
	}
	logf("%s run %d: after the update, peak %.1f MiB, cgroup peak %s (%v)", be, run, float64(r.updateHWM)/1024, mib(r.cgEnd.peak), r.cgEnd.atPeak)
	return r, nil
}
