package felix

// Address plan: the node is internal/testing/resettest's (pod0 10.244.1.1/24 and fd00:10:244:1::1/64 towards
// the pod, ext0 192.0.2.1/24 and 2001:db8:1::1/64 towards the external server; the Node's
// InternalIPs are the ext0 addresses), plus the veth to the control plane. The LoadBalancer's
// External-IPs, 203.0.113.10 and 2001:db8:113::10 (documentation prefixes), exist nowhere: they
// only give ipvs-externalip-dnat entries to keep.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/felixtest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

const (
	// durationEnv sets how long Felix and the agent run side by side (Go duration; default 60s).
	durationEnv     = "NNM_FELIX_DURATION"
	defaultDuration = 60 * time.Second

	syncPeriod    = 2 * time.Second
	minSyncPeriod = time.Second // the agent's default
	// settle is how long both get before the first snapshot: Felix's post-write re-checks and
	// several of the agent's resyncs.
	settle = 15 * time.Second

	saNamespace = "kube-system"
	saName      = "network-node-manager"
	svcName     = "felix-lb"
	svcNS       = "default"

	fixDrop  = "invalid-drop"
	fixExtIP = "ipvs-externalip-dnat"
)

var (
	fixes    = []string{fixDrop, fixExtIP}
	families = []string{"ipv4", "ipv6"}
	ingress  = []string{"203.0.113.10", "2001:db8:113::10"}
)

const agentConfig = `# written by e2e/felix
fixes:
  invalid-drop:
    enabled: true
  ipvs-externalip-dnat:
    enabled: true
`

func TestFelixBesideAgent(t *testing.T) {
	b := felixtest.Load(t)
	netns.Require(t, "iptables-nft-save", "ip6tables-nft-save", "nft", "conntrack", "ipset")
	agenttest.Require(t)
	if err := controlplane.CheckPrerequisites(""); err != nil {
		t.Fatalf("the Felix lane needs the control plane: %v (make controlplane)", err)
	}
	dur := felixtest.Duration(t, durationEnv, defaultDuration)
	t.Logf("Felix %s (Calico %s, libbpf %s; nftables data plane: %v); side by side for %v at syncPeriod %v",
		b.Bin, b.CalicoCommit, b.LibbpfVersion, b.NFTables, dur, syncPeriod)

	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	files, err := agenttest.DeployBaseFiles()
	if err != nil {
		t.Fatal(err)
	}
	if err := agenttest.ApplyManifests(ctx, cp.AdminRESTConfig(), files, nil); err != nil {
		t.Fatalf("apply deploy/base: %v", err)
	}
	felixtest.InstallCRDs(t, cp.AdminRESTConfig(), b)
	createLoadBalancer(t, cp.AdminClient())

	modes := []felixtest.Mode{felixtest.IptablesNFT}
	if b.NFTables {
		modes = append(modes, felixtest.NFTables)
	} else {
		t.Logf("Calico %s has no nftables data plane: only Felix's iptables-nft mode runs", b.CalicoCommit)
	}
	for _, mode := range modes {
		for _, backend := range []string{"iptables", "nftables"} {
			t.Run(fmt.Sprintf("felix=%s/agent=%s", mode, backend), func(t *testing.T) {
				t.Parallel()
				runLane(t, cp, b, mode, backend, dur)
			})
		}
	}
}

// createLoadBalancer makes a dual-stack LoadBalancer with externalTrafficPolicy: Local and an
// ingress address per family: the DNAT fix's entries.
func createLoadBalancer(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := cs.CoreV1().Services(svcNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			IPFamilyPolicy:        &policy,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Selector:              map[string]string{"app": "web"},
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service: %v", err)
	}
	for _, ip := range ingress {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	if _, err := cs.CoreV1().Services(svcNS).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set the Service's ingress: %v", err)
	}
}

// runLane runs Felix in mode and the agent with backend on a node of their own for dur and checks
// what must hold.
func runLane(t *testing.T, cp *controlplane.ControlPlane, b *felixtest.Build, mode felixtest.Mode, backend string, dur time.Duration) {
	ctx := t.Context()
	tp := resettest.New(t)
	node := tp.Node
	name := "felix-" + node.Name[len(node.Name)-8:]
	adminKC, err := cp.ConnectNamespace(node.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DisconnectNamespace(node.Name) })
	saKC, err := cp.ServiceAccountKubeconfig(ctx, saNamespace, saName, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubeproxytest.CreateNode(ctx, cp.AdminClient(), name, resettest.V4.NodeExt.String(), resettest.V6.NodeExt.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	fx := felixtest.StartT(t, b, felixtest.Options{Netns: node.Name, Kubeconfig: adminKC, NodeName: name, Mode: mode})
	took := fx.WaitProgrammedT(t, 3*time.Minute)
	t.Logf("Felix (%s) programmed its rules in %v", mode, took.Round(100*time.Millisecond))
	before := fx.Count(felixtest.OutOfSync)
	insertsBefore := fx.Count(felixtest.OutOfSyncInserts)

	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(agentConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	a := agenttest.StartT(t, agenttest.Options{Netns: node.Name, Args: []string{
		"--kubeconfig", saKC, "--node-name", name, "--config", cfg,
		"--backend", backend, "--iptables-variant", "nft", "--proxy-mode", "ipvs",
		"--families", "ipv4,ipv6",
		"--min-sync-period", minSyncPeriod.String(), "--sync-period", syncPeriod.String(),
		"--pod-cidrs", resettest.V4.PodCIDR.String() + "," + resettest.V6.PodCIDR.String(),
	}})
	a.WaitReadyT(t, 60*time.Second)
	agentStart := time.Now()
	// Both fixes have rules in both families: the DNAT fix has the Service's entries.
	agenttest.Eventually(t, 30*time.Second, func() error {
		m, err := a.Metrics(ctx)
		if err != nil {
			return err
		}
		for _, f := range fixes {
			for _, fam := range families {
				if v, _ := m.Value("nnm_rules_programmed", "fix", f, "family", fam); v == 0 {
					return fmt.Errorf("nnm_rules_programmed{fix=%q,family=%q} = 0", f, fam)
				}
			}
		}
		return nil
	})

	time.Sleep(settle)
	first := snapshot(t, node)
	atFirst := fx.Count(felixtest.OutOfSync)
	t.Logf("%s/%s: jump order after %v:\n%s", mode, backend, settle, first)
	for _, fam := range []string{"ip", "ip6"} {
		if err := first.hasBoth(fam); err != nil {
			t.Fatalf("%v\n%s", err, node.MustExec("nft", "list", "ruleset"))
		}
	}

	// Side by side: both must keep running; progress once a minute.
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(min(time.Until(deadline), time.Minute)):
		}
		if err := fx.Exited(); err != nil {
			t.Fatalf("Felix exited: %v", err)
		}
		if err := a.Exited(); err != nil {
			t.Fatalf("the agent exited: %v", err)
		}
		n := fx.Count(felixtest.OutOfSync)
		t.Logf("%s/%s: %v of %v; repairs %v, Felix out-of-sync warnings %d", mode, backend,
			time.Since(deadline.Add(-dur)).Round(time.Second), dur, repairs(t, a), n-before)
	}
	second := snapshot(t, node)
	elapsed := time.Since(agentStart).Round(time.Second)

	// The record: ours per fix and family, Felix's warnings, over the whole time since the agent
	// started (startup included).
	m := a.MetricsT(t)
	var table strings.Builder
	var total float64
	fmt.Fprintf(&table, "felix=%s agent=%s, %v since the agent started, syncPeriod %v:\n", mode, backend, elapsed, syncPeriod)
	for _, f := range fixes {
		for _, fam := range families {
			v := m.Sum("nnm_sync_repairs_total", "fix", f, "family", fam)
			syncs := m.Sum("nnm_syncs_total", "fix", f)
			total += v
			fmt.Fprintf(&table, "  nnm_sync_repairs_total{fix=%q,family=%q} %v   (nnm_syncs_total{fix=%q} %v)\n", f, fam, v, f, syncs)
			if syncs == 0 {
				t.Errorf("nnm_syncs_total{fix=%q} = 0: the fix never synced", f)
			}
		}
	}
	inserts := fx.Count(felixtest.OutOfSyncInserts)
	warnings := fx.Matches(felixtest.OutOfSync)
	all := len(warnings)
	fmt.Fprintf(&table, "  Felix %q warnings: %d since the agent started (%d before it); all %q warnings since then: %d, of which %d while the agent started and settled (%v) and %d in the %v after\n",
		felixtest.OutOfSyncInserts, inserts-insertsBefore, insertsBefore, felixtest.OutOfSync, all-before, atFirst-before, settle, all-atFirst, dur)
	t.Log(table.String())
	if total != 0 {
		t.Errorf("the agent repaired its rules %v times beside Felix (%s mode), want 0: the two fight over the chains", total, mode)
	}
	if all-before != 0 {
		t.Errorf("Felix logged %d %q warnings since the agent started, want 0; the first:\n%s", all-before, felixtest.OutOfSync, strings.Join(warnings[before:min(all, before+6)], "\n"))
	}
	for _, fam := range []string{"ip", "ip6"} {
		if err := second.hasBoth(fam); err != nil {
			t.Errorf("after %v: %v", dur, err)
		}
	}
	if first.String() != second.String() {
		t.Errorf("the jump order changed between %v and %v after the agent started:\nfirst:\n%s\nsecond:\n%s", settle, elapsed, first, second)
	}

	// The connection-reset reproduction with Felix's chains in place: no RST, per family.
	for _, p := range resettest.Plans {
		in := resettest.Inject(t, tp, p, false)
		t.Logf("%s/%s reset reproduction: %s", mode, backend, in)
		if err := in.Prevented(); err != nil {
			t.Errorf("%s: %v", p.Family, err)
		}
		if _, err := in.DropMetric(a.MetricsT(t)); err != nil {
			t.Errorf("%s: %v", p.Family, err)
		}
	}
}

// repairs is the agent's nnm_sync_repairs_total over every fix and family.
func repairs(t *testing.T, a *agenttest.Agent) float64 {
	return a.MetricsT(t).Sum("nnm_sync_repairs_total")
}

// order is the node's base chains (nft list ruleset: the iptables-nft tables' built-in chains, and
// the base chains of the nft tables: ours, Felix's in nftables mode, the reset reproduction's), each
// with its hook and priority and the jumps and gotos of its rules in kernel order. Rules without a
// jump (a drop, a counter) are left out: the order of the chains that the agents insert is what the
// tug-of-war changes.
type order []string

var (
	tableRE = regexp.MustCompile(`^table (\S+) (\S+) \{`)
	chainRE = regexp.MustCompile(`^\tchain (\S+) \{`)
	hookRE  = regexp.MustCompile(`^\t\ttype (\S+) hook (\S+) (?:device \S+ )?priority ([^;]+);`)
	jumpRE  = regexp.MustCompile(`\b(?:jump|goto) (\S+)`)
)

func snapshot(t *testing.T, node *netns.NS) order {
	t.Helper()
	return parseOrder(node.MustExec("nft", "list", "ruleset"))
}

func parseOrder(text string) order {
	var o order
	var table, chain, hook string
	var jumps []string
	flush := func() {
		if hook != "" {
			o = append(o, fmt.Sprintf("%s %s [%s]: %s", table, chain, hook, strings.Join(jumps, " ")))
		}
		chain, hook, jumps = "", "", nil
	}
	for _, line := range strings.Split(text, "\n") {
		if m := tableRE.FindStringSubmatch(line); m != nil {
			flush()
			table = m[1] + " " + m[2]
		} else if m := chainRE.FindStringSubmatch(line); m != nil {
			flush()
			chain = m[1]
		} else if m := hookRE.FindStringSubmatch(line); m != nil && chain != "" {
			hook = m[1] + " " + m[2] + " " + m[3]
		} else if line == "\t}" {
			flush()
		} else if chain != "" {
			for _, m := range jumpRE.FindAllStringSubmatch(line, -1) {
				jumps = append(jumps, strings.Trim(m[1], `"`))
			}
		}
	}
	flush()
	slices.Sort(o) // tables and chains by name; the rules within a chain stay in kernel order
	return o
}

func (o order) String() string { return "  " + strings.Join(o, "\n  ") }

// hasBoth checks that nft family fam (ip, ip6) holds Felix's rules (a cali- jump or table calico)
// and ours (an NNM- jump or an nnm- table).
func (o order) hasBoth(fam string) error {
	var felix, ours bool
	for _, c := range o {
		if !strings.HasPrefix(c, fam+" ") {
			continue
		}
		felix = felix || strings.HasPrefix(c, fam+" calico ") || strings.Contains(c, " cali-")
		ours = ours || strings.HasPrefix(c, fam+" nnm-") || strings.Contains(c, " NNM-")
	}
	if !felix || !ours {
		return fmt.Errorf("family %s: Felix's rules present %v, the agent's %v:\n%s", fam, felix, ours, o)
	}
	return nil
}
