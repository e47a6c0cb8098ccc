package e2e

// Address plan of the scenarios (all made up, never routed anywhere; every node is its own netns):
//
//	Cluster-IPs      10.96.0.0/16, fd00:10:96::/112   allocated by kube-apiserver
//	pod CIDRs        10.244.1.0/24, fd00:10:244:1::/64 (--pod-cidrs)
//	External-IPs     203.0.<scenario>.<n>, 2001:db8:<scenario>::<n>
//
// Every scenario uses the Kubernetes namespace "s<scenario>-<backend>" and deletes its Services when it
// ends, so the next scenario's agent starts from an empty cluster.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

type scenario struct {
	name string
	run  func(t *testing.T, c *cluster, backend string)
}

var scenarios = []scenario{
	{"1-ingress-ip-programmed-within-2s", scenarioIngressLatency},
	{"2-updates-ports-type-change-delete", scenarioUpdates},
	{"3-dual-stack-and-ipv6-only", scenarioDualStack},
	{"4-no-dnat-for-proxy-headless-externalname", scenarioNoDNAT},
	{"5-unparsable-ip-skipped-and-counted", scenarioBadIP},
	{"6-deleted-while-agent-down", scenarioAgentDown},
	{"7-flushed-rules-restored", scenarioFlush},
	{"8-apiserver-outage", scenarioAPIServerOutage},
	{"9-fix-disabled-in-config-file", scenarioDisableFix},
	{"10-backend-switch", scenarioBackendSwitch},
	{"least-privilege-rbac", scenarioLeastPrivilege},
}

// TestScenarios runs every scenario against both backends: the backends in parallel, each on a control
// plane of its own, the scenarios of one backend one after the other.
func TestScenarios(t *testing.T) {
	// Beside TestBlindWatchesAreKnown, which mostly waits for its API server's outage and the
	// reflectors' backoff: top-level parallel tests run after every sequential one, so the two
	// overlap instead of adding up at the end of the package.
	t.Parallel()
	eachBackend(t, func(t *testing.T, c *cluster, be string) {
		for _, sc := range scenarios {
			t.Run(sc.name, func(t *testing.T) { sc.run(t, c, be) })
		}
	})
}

func nsName(scenario int, backend string) string {
	return fmt.Sprintf("s%d-%s", scenario, backend)
}

// checkSyncHealthy asserts the metrics every healthy agent shows: both fixes enabled, no sync errors,
// both fixes' chains in the kernel for both families.
func (n *node) checkSyncHealthy() {
	n.t.Helper()
	// Polled: the kernel can hold a fix's rules a moment before its gauges are set, and a scrape
	// taken first would see the gauge of before (scenario 9 re-enables a fix and checks at once).
	var last error
	err := agenttest.Poll(n.t.Context(), converge, 50*time.Millisecond, func() error {
		m := n.metrics()
		var errs []error
		for _, f := range []string{fixDrop, fixExtIP} {
			if v, _ := m.Value("nnm_fix_enabled", "fix", f); v != 1 {
				errs = append(errs, fmt.Errorf("nnm_fix_enabled{fix=%q} = %v, want 1", f, v))
			}
			if v := m.Sum("nnm_sync_errors_total", "fix", f); v != 0 {
				errs = append(errs, fmt.Errorf("nnm_sync_errors_total{fix=%q} = %v, want 0", f, v))
			}
			for _, fam := range []string{"ipv4", "ipv6"} {
				if err := n.fixPresent(f, fam); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if v, _ := m.Value("nnm_rules_programmed", "fix", fixDrop, "backend", n.backend, "family", "ipv4"); v < 1 {
			errs = append(errs, fmt.Errorf("nnm_rules_programmed{fix=invalid-drop,backend=%s,family=ipv4} = %v, want ≥ 1", n.backend, v))
		}
		last = errors.Join(errs...)
		return last
	})
	if err != nil {
		// The agent's last logged error first: a failed sync counted in nnm_sync_errors_total is
		// logged with its cause, and the first line is what a summary of the run shows.
		logged := "none"
		if w := n.agent.LogWarnings(1); w != "" {
			logged = w
		}
		n.t.Errorf("sync not healthy within %v (the agent's last warning or error: %s): %v", converge, logged, last)
	}
}

// checkCounts waits until the metrics report covered Services per family and rules_programmed of the
// External-IP fix equal to base + entries per family (base: its fixed chain rules).
func (n *node) checkCounts(covered4, covered6, entries4, entries6 int) {
	n.t.Helper()
	var last string
	err := agenttest.Poll(n.t.Context(), converge, 50*time.Millisecond, func() error {
		m := n.metrics()
		var errs []string
		for _, c := range []struct {
			fam              string
			covered, entries int
		}{{"ipv4", covered4, entries4}, {"ipv6", covered6, entries6}} {
			cov, _ := m.Value("nnm_fix_objects_covered", "fix", fixExtIP, "family", c.fam)
			if int(cov) != c.covered {
				errs = append(errs, fmt.Sprintf("nnm_fix_objects_covered{%s} = %v, want %d", c.fam, cov, c.covered))
			}
			rules, _ := m.Value("nnm_rules_programmed", "fix", fixExtIP, "backend", n.backend, "family", c.fam)
			if int(rules) != extipBaseRules+c.entries {
				errs = append(errs, fmt.Sprintf("nnm_rules_programmed{%s} = %v, want %d chain rules + %d entries", c.fam, rules, extipBaseRules, c.entries))
			}
		}
		last = strings.Join(m.Lines("nnm_fix_objects", "nnm_rules_programmed"), "\n")
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "; "))
		}
		return nil
	})
	if err != nil {
		n.t.Fatalf("%v\nmetrics:\n%s", err, last)
	}
}

// extipBaseRules is the number of chain rules of ipvs-externalip-dnat per family with a pod CIDR:
// prerouting (pod CIDR), output (host), dnat (DNAT lookup), postrouting (masquerade of what the
// fix DNATed, by conntrack: no mark since issue #41 row 8).
const extipBaseRules = 4

// 1. Create a LoadBalancer Service, then set its ingress IP: rules appear within 2 s.
func scenarioIngressLatency(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(1, backend))
	n.checkSyncHealthy()

	svc := svcs.create(lbService("", "web", withPorts(tcpPort("http", 80), udpPort("dns", 53))))
	// Without an ingress IP there is nothing to DNAT.
	time.Sleep(3 * minSyncPeriod)
	n.expectEntries(converge)
	n.checkCounts(0, 0, 0, 0)

	start := time.Now()
	svcs.setIngress("web", "203.0.1.10")
	n.expectEntries(2*time.Second, want(svc, "203.0.1.10", "tcp", 80), want(svc, "203.0.1.10", "udp", 53))
	latency := time.Since(start)
	t.Logf("%s: status update → rules in the kernel: %v", backend, latency.Round(time.Millisecond))
	if latency > 2*time.Second {
		t.Errorf("rules appeared after %v, want ≤ 2s", latency)
	}
	n.checkCounts(1, 0, 2, 0)
	n.checkSyncHealthy()
}

// 2. Change the ingress IP; add and remove a port; switch a Service to ClusterIP type; delete it: rules
// follow, nothing stale remains.
func scenarioUpdates(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(2, backend))

	web := svcs.create(lbService("", "web"))
	other := svcs.create(lbService("", "other", withPorts(udpPort("dns", 53))))
	svcs.setIngress("web", "203.0.2.10")
	svcs.setIngress("other", "203.0.2.20")
	otherEntry := want(other, "203.0.2.20", "udp", 53)
	n.expectEntries(converge, want(web, "203.0.2.10", "tcp", 80), otherEntry)
	n.checkCounts(2, 0, 2, 0)

	t.Log("change the ingress IP")
	svcs.setIngress("web", "203.0.2.11")
	n.expectEntries(converge, want(web, "203.0.2.11", "tcp", 80), otherEntry)

	t.Log("add a port")
	web = svcs.update("web", func(s *corev1.Service) { s.Spec.Ports = append(s.Spec.Ports, tcpPort("https", 443)) })
	n.expectEntries(converge, want(web, "203.0.2.11", "tcp", 80), want(web, "203.0.2.11", "tcp", 443), otherEntry)
	n.checkCounts(2, 0, 3, 0)

	t.Log("remove a port")
	web = svcs.update("web", func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[1:] })
	n.expectEntries(converge, want(web, "203.0.2.11", "tcp", 443), otherEntry)
	n.checkCounts(2, 0, 2, 0)

	t.Log("switch to type ClusterIP")
	svcs.update("web", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalTrafficPolicy = ""
		s.Spec.AllocateLoadBalancerNodePorts = nil
		s.Spec.HealthCheckNodePort = 0
	})
	n.expectEntries(converge, otherEntry)
	n.checkCounts(1, 0, 1, 0)

	t.Log("delete")
	svcs.delete("other")
	svcs.delete("web")
	n.expectEntries(converge)
	n.checkCounts(0, 0, 0, 0)
	n.checkSyncHealthy()
}

// 3. A dual-stack Service (IPv4 and IPv6 Cluster-IPs and ingress IPs) and an IPv6-only Service.
func scenarioDualStack(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(3, backend))

	dual := svcs.create(lbService("", "dual", dualStack, withPorts(tcpPort("http", 80), udpPort("dns", 53))))
	if clusterIP(dual, "ipv4") == "" || clusterIP(dual, "ipv6") == "" {
		t.Fatalf("dual-stack Service got clusterIPs %v", dual.Spec.ClusterIPs)
	}
	v6 := svcs.create(lbService("", "v6only", ipv6Only))
	if clusterIP(v6, "ipv4") != "" || clusterIP(v6, "ipv6") == "" {
		t.Fatalf("IPv6-only Service got clusterIPs %v", v6.Spec.ClusterIPs)
	}
	svcs.setIngress("dual", "203.0.3.10", "2001:db8:3::10")
	// An IPv4 ingress IP on an IPv6-only Service has no Cluster-IP of its family: skipped, not DNATed.
	svcs.setIngress("v6only", "2001:db8:3::20", "203.0.3.20")
	n.expectEntries(converge,
		want(dual, "203.0.3.10", "tcp", 80), want(dual, "203.0.3.10", "udp", 53),
		want(dual, "2001:db8:3::10", "tcp", 80), want(dual, "2001:db8:3::10", "udp", 53),
		want(v6, "2001:db8:3::20", "tcp", 80))
	n.checkCounts(1, 2, 2, 3)
	// Each family syncs on its own worker: the IPv4 sync that counts the skip may come after the
	// IPv6 entry is in the kernel (the IPv4 kernel state does not change with it), so wait for it.
	var last string
	if err := agenttest.Poll(t.Context(), converge, 50*time.Millisecond, func() error {
		m := n.metrics()
		last = strings.Join(m.Lines("nnm_fix_objects_skipped"), "\n")
		if v, _ := m.Value("nnm_fix_objects_skipped", "fix", fixExtIP, "family", "ipv4", "reason", "no-cluster-ip"); v != 1 {
			return fmt.Errorf("nnm_fix_objects_skipped{family=ipv4,reason=no-cluster-ip} = %v, want 1", v)
		}
		return nil
	}); err != nil {
		t.Errorf("%v\n%s", err, last)
	}
	n.checkSyncHealthy()
}

// 4. ipMode: Proxy ingress, headless and ExternalName Services produce no DNAT. The last two get
// External-IPs only through spec.externalIPs, which the fix reads only with specExternalIPs on.
func scenarioNoDNAT(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{config: defaultConfig + "    specExternalIPs: true\n"})
	svcs := newServices(t, c, nsName(4, backend))

	svcs.create(lbService("", "proxied"))
	svcs.setIngress("proxied", "203.0.4.10/proxy")
	svcs.create(lbService("", "headless", withExternalIPs("203.0.4.20"), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ClusterIP = corev1.ClusterIPNone
		s.Spec.ExternalTrafficPolicy = ""
		s.Spec.AllocateLoadBalancerNodePorts = nil
	}))
	svcs.create(lbService("", "extname", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeExternalName
		s.Spec.ExternalName = "example.com"
		s.Spec.ExternalIPs = []string{"203.0.4.30"}
		s.Spec.ExternalTrafficPolicy = ""
		s.Spec.AllocateLoadBalancerNodePorts = nil
		s.Spec.Selector = nil
	}))
	// A normal Service created last proves the agent has seen the others when its entry shows up.
	control := svcs.create(lbService("", "control"))
	svcs.setIngress("control", "203.0.4.40")
	n.expectEntries(converge, want(control, "203.0.4.40", "tcp", 80))
	n.checkCounts(1, 0, 1, 0)

	m := n.metrics()
	for _, reason := range []string{"ipmode-proxy", "headless", "external-name"} {
		if v, _ := m.Value("nnm_fix_objects_skipped", "fix", fixExtIP, "family", "ipv4", "reason", reason); v != 1 {
			t.Errorf("nnm_fix_objects_skipped{family=ipv4,reason=%s} = %v, want 1\n%s", reason, v, strings.Join(m.Lines("nnm_fix_objects_skipped"), "\n"))
		}
	}
	// The kernel has no trace of the three addresses, in any rule.
	dump := n.dump()
	for _, ip := range []string{"203.0.4.10", "203.0.4.20", "203.0.4.30"} {
		if strings.Contains(dump, ip) {
			t.Errorf("%s appears in the ruleset:\n%s", ip, dump)
		}
	}
	n.checkSyncHealthy()
}

// 5. A Service with an unparsable external IP is skipped and counted; the others are programmed.
//
// kube-apiserver validates IPs, but its legacy parser accepts IPv4 with leading zeros ("203.0.5.010"),
// which Go's netip (and so the agent) rejects: such addresses exist in real clusters.
func scenarioBadIP(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(5, backend))

	bad := svcs.create(lbService("", "bad", withExternalIPs(badIP)))
	svcs.setIngress("bad", "203.0.5.11")
	good := svcs.create(lbService("", "good"))
	svcs.setIngress("good", "203.0.5.20")
	n.expectEntries(converge, want(bad, "203.0.5.11", "tcp", 80), want(good, "203.0.5.20", "tcp", 80))
	n.checkCounts(2, 0, 2, 0)
	agenttest.Eventually(t, converge, func() error {
		m := n.metrics()
		if v, _ := m.Value("nnm_fix_objects_skipped", "fix", fixExtIP, "family", "ipv4", "reason", "bad-ip"); v != 1 {
			return fmt.Errorf("nnm_fix_objects_skipped{family=ipv4,reason=bad-ip} = %v, want 1\n%s", v, strings.Join(m.Lines("nnm_fix_objects_skipped"), "\n"))
		}
		return nil
	})
	if !strings.Contains(n.agent.Logs(), badIP) {
		t.Errorf("the agent's log does not name the skipped address %q", badIP)
	}
	n.checkSyncHealthy()
}

const badIP = "203.0.5.010"

// 6. Services deleted while the agent is down: after restart the stale rules are gone.
func scenarioAgentDown(t *testing.T, c *cluster, backend string) {
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(6, backend))

	a := svcs.create(lbService("", "a"))
	b := svcs.create(lbService("", "b"))
	svcs.setIngress("a", "203.0.6.10")
	svcs.setIngress("b", "203.0.6.20")
	n.expectEntries(converge, want(a, "203.0.6.10", "tcp", 80), want(b, "203.0.6.20", "tcp", 80))

	if err := n.agent.Stop(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	// Stopping the agent must not interrupt traffic: the rules stay.
	n.expectEntries(time.Second, want(a, "203.0.6.10", "tcp", 80), want(b, "203.0.6.20", "tcp", 80))
	svcs.delete("a")
	svcs.setIngress("b", "203.0.6.21")

	if err := n.agent.Restart(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	n.waitReady()
	// Ready means one full sync pass ran: the kernel must already be right.
	n.expectEntries(0, want(b, "203.0.6.21", "tcp", 80))
	n.checkCounts(1, 0, 1, 0)
	n.checkSyncHealthy()
}

// startServing starts a node for scenario number i with Service svc (port 80/tcp) at the ingress
// addresses, and waits for its DNAT entries, which it returns with the Service as created.
func startServing(t *testing.T, c *cluster, backend string, i int, svc *corev1.Service, ingress ...string) (*node, *services, *corev1.Service, []string) {
	t.Helper()
	n := startNode(t, c, backend, nodeOptions{})
	svcs := newServices(t, c, nsName(i, backend))
	created := svcs.create(svc)
	svcs.setIngress(svc.Name, ingress...)
	var entries []string
	for _, ip := range ingress {
		entries = append(entries, want(created, ip, "tcp", 80))
	}
	n.expectEntries(converge, entries...)
	return n, svcs, created, entries
}

// 7. Someone flushes our chain/table: restored within the resync period.
func scenarioFlush(t *testing.T, c *cluster, backend string) {
	n, _, _, entries := startServing(t, c, backend, 7, lbService("", "web", dualStack), "203.0.7.10", "2001:db8:7::10")
	repairs := n.metrics().Sum("nnm_sync_repairs_total")

	var cmds [][]string
	if backend == "iptables" {
		ipt, ip6t := "iptables", "ip6tables"
		if n.variant == "legacy" || n.variant == "nft" {
			ipt, ip6t = ipt+"-"+n.variant, ip6t+"-"+n.variant
		}
		cmds = [][]string{
			{ipt, "-w", "-t", "nat", "-F", "NNM-EXTIP-DNAT"},
			{ip6t, "-w", "-t", "nat", "-F", "NNM-EXTIP-DNAT"},
			{ipt, "-w", "-t", "mangle", "-F", "NNM-INVALID-INPUT"},
			// and the jump into it
			{ipt, "-w", "-t", "mangle", "-D", "INPUT", "-m", "comment", "--comment", "network-node-manager:" + fixDrop, "-j", "NNM-INVALID-INPUT"},
		}
	} else {
		cmds = [][]string{
			// flush table empties the chains but keeps map elements: flush the maps too.
			{"nft", "flush", "table", "ip", "nnm-" + fixExtIP},
			{"nft", "flush", "map", "ip", "nnm-" + fixExtIP, "svc"},
			{"nft", "flush", "map", "ip6", "nnm-" + fixExtIP, "svc"},
			{"nft", "delete", "table", "ip", "nnm-" + fixDrop},
		}
	}
	start := time.Now()
	for _, cmd := range cmds {
		n.ns.MustExec(cmd...)
	}
	// No check that the flush left the kernel empty: the agent's verify pass is cheap now and may
	// restore the rules before such a check could look. The repair counter below proves that the
	// agent saw the flush and restored what it owns. The restore is due at the next verify pass (one
	// sync period). The bound is converge: with three test packages sharing 2 cores, iptables once
	// missed sync period + 1 s. The time it took is logged; a test does not fail on a timing.
	n.expectEntries(converge, entries...)
	agenttest.Eventually(t, converge, func() error {
		return errors.Join(n.fixPresent(fixDrop, "ipv4"), n.fixPresent(fixExtIP, "ipv4"), n.fixPresent(fixExtIP, "ipv6"))
	})
	t.Logf("%s: restored %v after the flush (sync period %v)", backend, time.Since(start).Round(time.Millisecond), syncPeriod)
	agenttest.Eventually(t, converge, func() error {
		if got := n.metrics().Sum("nnm_sync_repairs_total"); got <= repairs {
			return fmt.Errorf("nnm_sync_repairs_total = %v, want > %v", got, repairs)
		}
		return nil
	})
	n.checkSyncHealthy()
}

// 8. kube-apiserver stopped for a while and started again: the rules stay in place throughout, changes
// made after it returns are applied, and /healthz stays ok: the agent keeps resyncing the kernel from
// its informer cache, so "no successful sync for 2 × syncPeriod" never happens; an outage shows in the
// logs, not as a failing liveness probe that would restart every agent of the cluster at once.
func scenarioAPIServerOutage(t *testing.T, c *cluster, backend string) {
	n, svcs, a, before := startServing(t, c, backend, 8, lbService("", "a"), "203.0.8.10")

	stopStart := time.Now()
	if err := c.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver stopped in %v", time.Since(stopStart).Round(time.Millisecond))
	restarted := false
	t.Cleanup(func() {
		if !restarted { // leave a working control plane to the next scenario
			_ = c.cp.StartAPIServer(context.Background())
		}
	})
	outageStart := time.Now()
	lastSync := n.metric("nnm_last_successful_sync_timestamp_seconds", "fix", fixExtIP, "backend", backend)
	// Longer than the 2 × syncPeriod after which /healthz would fail without successful syncs.
	outage := 2*syncPeriod + time.Second
	agenttest.Consistently(t, outage, func() error {
		got, err := n.dnatEntries("ipv4")
		if err != nil {
			return err
		}
		if !slices.Equal(got, before) {
			return fmt.Errorf("during the outage the kernel holds %q, want %q", got, before)
		}
		return n.agent.Probe(t.Context(), "/healthz")
	})
	if v := n.metric("nnm_last_successful_sync_timestamp_seconds", "fix", fixExtIP, "backend", backend); v <= lastSync {
		t.Errorf("no successful sync during the outage: last_successful_sync_timestamp %v → %v", lastSync, v)
	}
	if err := n.agent.Probe(t.Context(), "/readyz"); err != nil {
		t.Errorf("/readyz during the outage: %v", err)
	}

	startStart := time.Now()
	if err := c.cp.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("kube-apiserver ready again in %v", time.Since(startStart).Round(time.Millisecond))
	t.Logf("kube-apiserver was down for %v", time.Since(outageStart).Round(time.Millisecond))
	back := time.Now()
	b := svcs.create(lbService("", "b"))
	svcs.setIngress("b", "203.0.8.20")
	svcs.setIngress("a", "203.0.8.11")
	// client-go's watch reconnects with back-off (up to ~30 s after a long outage).
	n.expectEntries(45*time.Second, want(a, "203.0.8.11", "tcp", 80), want(b, "203.0.8.20", "tcp", 80))
	t.Logf("%s: changes after the restart applied in %v", backend, time.Since(back).Round(time.Millisecond))
	if err := n.agent.Probe(t.Context(), "/healthz"); err != nil {
		t.Errorf("/healthz after the outage: %v", err)
	}
	n.checkSyncHealthy()
}

// 9. A fix disabled in the config file: its rules are removed, the other fix's rules stay.
func scenarioDisableFix(t *testing.T, c *cluster, backend string) {
	n, _, _, entries := startServing(t, c, backend, 9, lbService("", "web"), "203.0.9.10")
	n.checkSyncHealthy()

	n.writeConfig(strings.Replace(defaultConfig, "invalid-drop:\n    enabled: true", "invalid-drop:\n    enabled: false", 1))
	agenttest.Eventually(t, converge, func() error {
		return errors.Join(n.fixAbsent(fixDrop, "ipv4"), n.fixAbsent(fixDrop, "ipv6"))
	})
	for _, fam := range []string{"ipv4", "ipv6"} {
		if err := n.fixPresent(fixExtIP, fam); err != nil {
			t.Error(err)
		}
	}
	n.expectEntries(0, entries...)
	agenttest.Eventually(t, converge, func() error {
		m := n.metrics()
		var errs []error
		if v, _ := m.Value("nnm_fix_enabled", "fix", fixDrop); v != 0 {
			errs = append(errs, fmt.Errorf("nnm_fix_enabled{fix=invalid-drop} = %v, want 0", v))
		}
		if v := m.Sum("nnm_rules_programmed", "fix", fixDrop); v != 0 {
			errs = append(errs, fmt.Errorf("nnm_rules_programmed{fix=invalid-drop} = %v, want 0", v))
		}
		if v, _ := m.Value("nnm_config_reloads_total", "result", "success"); v < 1 {
			errs = append(errs, fmt.Errorf("nnm_config_reloads_total{result=success} = %v, want ≥ 1", v))
		}
		return errors.Join(errs...)
	})
	if err := n.agent.Probe(t.Context(), "/healthz"); err != nil {
		t.Errorf("/healthz with a disabled fix: %v", err)
	}

	t.Log("enable it again")
	n.writeConfig(defaultConfig)
	agenttest.Eventually(t, converge, func() error {
		return errors.Join(n.fixPresent(fixDrop, "ipv4"), n.fixPresent(fixDrop, "ipv6"))
	})
	n.checkSyncHealthy()
}

// Scenario 10 (issue #20): the backend changes between runs, there and back (iptables → nftables →
// iptables, or the other way round), with both fixes on. After each start only the running backend's
// objects exist: the first sync programs ours, then the other backend's leftovers go.
func scenarioBackendSwitch(t *testing.T, c *cluster, backend string) {
	otherOf := map[string]string{"iptables": "nftables", "nftables": "iptables"}
	other := otherOf[backend]
	n, _, _, entries := startServing(t, c, backend, 10, lbService("", "web"), "203.0.10.10")
	for _, be := range []string{other, backend} {
		n.switchBackend(be)
		n.expectEntries(converge, entries...)
		took := agenttest.Eventually(t, converge, func() error {
			var errs []error
			for _, f := range []string{fixDrop, fixExtIP} {
				for _, fam := range []string{"ipv4", "ipv6"} {
					errs = append(errs, n.fixPresent(f, fam), n.as(otherOf[be]).fixAbsent(f, fam))
				}
			}
			if !strings.Contains(n.agent.Logs(), "removed what the other backend left") {
				errs = append(errs, fmt.Errorf("the agent has not logged the removal of the other backend's objects"))
			}
			return errors.Join(errs...)
		})
		t.Logf("switched to %s: only its objects left %v after /readyz", be, took.Round(time.Millisecond))
		n.checkSyncHealthy()
	}
}
