package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubeproxytest"
)

// diagnoseExtIP is the External-IP of Service "ext" (externalTrafficPolicy: Local, its one endpoint
// on another node).
const diagnoseExtIP = "203.0.113.77"

// diagnoseConfig enables mss-clamp through a nodeOverrides entry that selects every node: diagnose
// counts the fixes as the entry sets them and names it.
const diagnoseConfig = `nodeOverrides:
  - nodeSelector: {}
    fixes:
      mss-clamp: {enabled: true}
`

// runDiagnose runs `network-node-manager diagnose --output json` in the node namespace with the
// agent's service account (deploy/base's RBAC) and returns the report and the exit status.
func (n *kpNode) runDiagnose(t *testing.T) (*diagnose.Report, int) {
	t.Helper()
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cfg := t.TempDir() + "/config.yaml"
	if err := os.WriteFile(cfg, []byte(diagnoseConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := n.ns.Command(bin, "diagnose", "--output", "json", "--kubeconfig", n.saKubecfg, "--node-name", n.name,
		"--config", cfg, "--pod-cidrs", podCIDRv4+","+podCIDRv6, "--log-level", "warn")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("diagnose: %v\n%s", err, stderr.String())
	}
	var r diagnose.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("diagnose --output json (exit %d): %v\n%s\n%s", code, err, out, stderr.String())
	}
	if r.SchemaVersion != diagnose.SchemaVersion {
		t.Fatalf("schemaVersion %d", r.SchemaVersion)
	}
	return &r, code
}

func findingOf(t *testing.T, r *diagnose.Report, check string) diagnose.Finding {
	t.Helper()
	f := r.Find(check)
	if f == nil {
		t.Fatalf("no finding %s in %+v", check, r)
	}
	return *f
}

// createExtService creates Service "ext" (NodePort, eTP Local, External-IP diagnoseExtIP, TCP 80 →
// 8080) in ns with its one ready endpoint on another node, and returns a func deleting both.
func createExtService(t *testing.T, c *cluster, ns string) func() {
	t.Helper()
	ctx := t.Context()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			ExternalIPs: []string{diagnoseExtIP}, Selector: map[string]string{"app": "ext"},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(kpTCPPort)}},
		}}
	if _, err := c.admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "ext-1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: "ext", discoveryv1.LabelManagedBy: "nnm-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{kpEndpointIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}, NodeName: ptr("elsewhere")}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("tcp"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr[int32](kpTCPPort)}},
	}
	if _, err := c.admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	del := func() {
		_ = c.admin.DiscoveryV1().EndpointSlices(ns).Delete(context.Background(), "ext-1", metav1.DeleteOptions{})
		_ = c.admin.CoreV1().Services(ns).Delete(context.Background(), "ext", metav1.DeleteOptions{})
	}
	t.Cleanup(del)
	return del
}

// TestDiagnoseBesideKubeProxy (#40): `diagnose` in a node namespace beside the real kube-proxy, with
// the agent's service account and deploy/base's RBAC (which does not grant Pods: the stale-udp
// check says so), a config whose nodeOverrides entry enables mss-clamp.
//   - nftables mode: on the clean node the no-endpoint-services check names nothing; an eTP=Local
//     Service whose one endpoint is on another node puts its External-IP in kube-proxy's
//     no-endpoint-services map with a drop verdict, and diagnose names it (report only: exit status
//     0 since #61); deleted,
//     nothing again.
//   - iptables mode: nftables-migration names nothing before, and the localhost NodePorts after a
//     connection to 127.0.0.1:<NodePort> (kube-proxy's own counter); invalid-replies shows
//     kube-proxy's INVALID drop as evidence. The agent started there exports the findings
//     (nnm_diagnosis_state, one series per check and state).
func TestDiagnoseBesideKubeProxy(t *testing.T) {
	require(t)
	kubeproxytest.Require(t)
	c := sharedCluster(t, "kube-proxy")
	t.Run("nftables", func(t *testing.T) {
		n := startKubeProxyNode(t, c, "nftables")
		r, code := n.runDiagnose(t)
		if r.ProxyMode != "nftables" || r.ProxyModeSource != "metrics-endpoint" {
			t.Errorf("proxy mode %q from %q, want nftables from kube-proxy's /proxyMode", r.ProxyMode, r.ProxyModeSource)
		}
		if !strings.HasPrefix(r.Override, "override 0") {
			t.Errorf("override %q, want entry 0", r.Override)
		}
		for _, f := range r.Fixes {
			if f.ID == "mss-clamp" && !f.Enabled {
				t.Errorf("mss-clamp not enabled although the nodeOverrides entry enables it: %+v", r.Fixes)
			}
		}
		if f := findingOf(t, r, "stale-udp"); f.State != diagnose.CannotTell || !strings.Contains(f.Summary, "forbidden") {
			t.Errorf("stale-udp without Pods RBAC: %s %q, want cannot-tell naming the refusal", f.State, f.Summary)
		}
		if f := findingOf(t, r, "nft-no-endpoint-drop"); f.State != diagnose.OK {
			t.Fatalf("clean node: nft-no-endpoint-drop %s %q (exit %d)", f.State, f.Summary, code)
		}
		// kube-proxy's nftables mode installs no INVALID drop (dataplane/kubeproxy_test.go): said so.
		if inv := findingOf(t, r, "invalid-replies"); !strings.Contains(fmt.Sprint(inv.Evidence), "no `ct state invalid drop` in kube-proxy's nftables tables") {
			t.Errorf("invalid-replies does not say kube-proxy's nftables mode has no INVALID drop: %+v", inv.Evidence)
		}
		del := createExtService(t, c, "kp-nftables")
		var f diagnose.Finding
		agenttest.Eventually(t, 30*time.Second, func() error {
			r, code = n.runDiagnose(t)
			// Report only (#61): named and counted, but no exit status 2.
			if f = findingOf(t, r, "nft-no-endpoint-drop"); f.State != diagnose.Problem || !f.ReportOnly || r.Problems == 0 || code != 0 {
				return fmt.Errorf("nft-no-endpoint-drop %s %q, exit %d", f.State, f.Summary, code)
			}
			return nil
		})
		found := false
		for _, e := range f.Evidence {
			found = found || strings.HasPrefix(e.Value, diagnoseExtIP+" tcp/80")
		}
		if !found {
			t.Errorf("the evidence does not name %s tcp/80: %+v", diagnoseExtIP, f.Evidence)
		}
		t.Logf("nft-no-endpoint-drop: %s: %+v", f.Summary, f.Evidence)
		del()
		agenttest.Eventually(t, 30*time.Second, func() error {
			r, _ := n.runDiagnose(t)
			if f := findingOf(t, r, "nft-no-endpoint-drop"); f.State != diagnose.OK {
				return fmt.Errorf("after the deletion: %s %q", f.State, f.Summary)
			}
			return nil
		})
	})
	t.Run("iptables", func(t *testing.T) {
		n := startKubeProxyNode(t, c, "iptables")
		r, _ := n.runDiagnose(t)
		if f := findingOf(t, r, "nftables-migration"); f.State != diagnose.OK {
			t.Fatalf("clean node: nftables-migration %s %q %+v", f.State, f.Summary, f.Evidence)
		}
		// The running agent exports the same findings (its first run 10 s after start): with
		// invalid-drop enabled by its config, invalid-replies is handled.
		a := n.startAgent()
		agenttest.Eventually(t, 40*time.Second, func() error {
			m, err := a.Metrics(t.Context())
			if err != nil {
				return err
			}
			if v, ok := m.Value("nnm_diagnosis_state", "check", "invalid-replies", "state", "handled"); !ok || v != 1 {
				return fmt.Errorf("nnm_diagnosis_state{check=invalid-replies,state=handled} = %v (%v); diagnosis series: %v", v, ok, m.Lines("nnm_diagnosis_"))
			}
			if n := len(m.Find("nnm_diagnosis_state")); n != len(diagnose.Checks())*len(diagnose.States) {
				return fmt.Errorf("%d nnm_diagnosis_state series, want one per check and state", n)
			}
			return nil
		})
		n.cleanupAgent(a)
		inv := findingOf(t, r, "invalid-replies")
		if !strings.Contains(fmt.Sprint(inv.Evidence), "kube-proxy's INVALID drop (KUBE-FORWARD") {
			t.Errorf("invalid-replies does not show kube-proxy's INVALID drop: %+v", inv.Evidence)
		}
		var nodePort int32
		for _, p := range n.svc.Spec.Ports {
			if p.Protocol == corev1.ProtocolTCP {
				nodePort = p.NodePort
			}
		}
		dial := func() error {
			conn, err := netns.DialContext(n.ns.Path(), &net.Dialer{Timeout: 3 * time.Second})(t.Context(), "tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(nodePort)))
			if err != nil {
				return err
			}
			return conn.Close()
		}
		agenttest.Eventually(t, 30*time.Second, func() error {
			if err := dial(); err != nil {
				return fmt.Errorf("connect to 127.0.0.1:%d: %v", nodePort, err)
			}
			r, _ := n.runDiagnose(t)
			if f := findingOf(t, r, "nftables-migration"); f.State != diagnose.Problem || !strings.Contains(f.Summary, "NodePorts on 127.0.0.1") {
				return fmt.Errorf("nftables-migration %s %q", f.State, f.Summary)
			}
			return nil
		})
	})
}

// scaleSlices and scaleEndpoints: the EndpointSlices TestDiagnoseUnderShippedRBAC creates, each with
// as many endpoints (on other nodes): 200,000 endpoints, at which diagnose's one unpaginated list
// peaked at 149 MiB before #61. NNM_E2E_DIAGNOSE_SERVICES=10000 makes it that many Services, each
// with its slice (the figure of docs/diagnose.md; about 3 minutes more).
const (
	scaleSlices    = 2000
	scaleEndpoints = 100
)

// scaleServices is how many Services (and slices) the paged case creates: scaleSlices slices
// without Services, or NNM_E2E_DIAGNOSE_SERVICES Services with theirs.
func scaleServices(t *testing.T) (slices int, services bool) {
	v := os.Getenv("NNM_E2E_DIAGNOSE_SERVICES")
	if v == "" {
		return scaleSlices, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("NNM_E2E_DIAGNOSE_SERVICES=%q is not a count", v)
	}
	return n, true
}

// diagnoseRSSLimit is what diagnose may take at scaleSlices × scaleEndpoints: the agent container's
// memory budget (128Mi limit, 25 % spare), with the DaemonSet's GOMEMLIMIT.
const diagnoseRSSLimit = 96 << 20

// TestDiagnoseUnderShippedRBAC (#61): `diagnose` as the agent's ServiceAccount with deploy/base's
// RBAC, in a node namespace.
//   - rbac: the ipvs-external-ip check evaluates (before #61 the EndpointSlices were forbidden and it
//     said cannot tell, or handled when the fix was enabled): an eTP=Local Service whose endpoint is
//     on another node is named, exit status 2; every check that reads the API but the Pods (which
//     deploy/components/stale-udp-conntrack grants) gets what it lists.
//   - paged: with scaleSlices EndpointSlices of scaleEndpoints endpoints each, its reads are paged
//     and stripped: its peak RSS stays under diagnoseRSSLimit with the DaemonSet's GOMEMLIMIT.
func TestDiagnoseUnderShippedRBAC(t *testing.T) {
	require(t)
	c := sharedCluster(t, "kube-proxy")
	ctx := t.Context()
	ns := netns.New(t, "nnm-diag")
	if _, err := c.cp.ConnectNamespace(ns.Name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cp.DisconnectNamespace(ns.Name) })
	kc, err := c.cp.ServiceAccountKubeconfig(ctx, saNamespace, saName, ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T) (*diagnose.Report, int, *syscall.Rusage) {
		t.Helper()
		cmd := ns.Command(bin, "diagnose", "--output", "json", "--kubeconfig", kc, "--node-name", "diag-node",
			"--proxy-mode", "ipvs", "--set", "fixes.ipvs-externalip-dnat.enabled=false", "--log-level", "warn")
		cmd.Env = append(os.Environ(), "GOMEMLIMIT=64MiB")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("diagnose: %v\n%s", err, stderr.String())
		}
		var r diagnose.Report
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("diagnose (exit %d): %v\n%s", code, err, stderr.String())
		}
		return &r, code, cmd.ProcessState.SysUsage().(*syscall.Rusage)
	}
	t.Run("rbac", func(t *testing.T) {
		newServices(t, c, "diag-rbac") // the namespace
		createExtService(t, c, "diag-rbac")
		r, code, _ := run(t)
		f := findingOf(t, r, "ipvs-external-ip")
		if f.State != diagnose.Problem || !strings.Contains(fmt.Sprint(f.Evidence), "diag-rbac/ext "+diagnoseExtIP) || code != diagnose.ExitProblem {
			t.Errorf("ipvs-external-ip under deploy/base's RBAC: %s %q %v, exit %d; want a problem naming diag-rbac/ext %s, exit 2", f.State, f.Summary, f.Evidence, code, diagnoseExtIP)
		}
		for _, table := range []string{"EndpointSlices:", "Services:", "Node: list"} {
			if strings.Contains(r.API, table) {
				t.Errorf("%s cannot be read under the shipped RBAC: %s", table, r.API)
			}
		}
	})
	t.Run("paged", func(t *testing.T) {
		n, withServices := scaleServices(t)
		createScaleSlices(t, c, "diag-scale", n, withServices)
		start := time.Now()
		r, _, ru := run(t)
		rss := ru.Maxrss << 10
		t.Logf("diagnose with %d Services: %v, %d EndpointSlices × %d endpoints: %v, peak RSS %.1f MiB (GOMEMLIMIT 64MiB), api %s",
			n, withServices, n, scaleEndpoints, time.Since(start).Round(time.Millisecond), float64(rss)/(1<<20), r.API)
		if f := findingOf(t, r, "ipvs-external-ip"); f.State == diagnose.CannotTell {
			t.Errorf("ipvs-external-ip: cannot tell: %s", f.Summary)
		}
		if rss > diagnoseRSSLimit {
			t.Errorf("diagnose peaked at %.1f MiB RSS, above %d MiB", float64(rss)/(1<<20), diagnoseRSSLimit>>20)
		}
	})
}

// createScaleSlices creates n EndpointSlices of scaleEndpoints ready endpoints each (on nodes other
// than diagnose's) in namespace ns, with their Services if withServices, eight writers at a time.
func createScaleSlices(t *testing.T, c *cluster, ns string, n int, withServices bool) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			if withServices {
				svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d", i), Namespace: ns},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
				if _, err := c.admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			s := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%05d-1", i), Namespace: ns,
					Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%05d", i), discoveryv1.LabelManagedBy: "nnm-e2e"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr[int32](8080)}},
			}
			for j := range scaleEndpoints {
				k := i*scaleEndpoints + j
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+k>>16, k>>8&255, k&255)},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
					NodeName:   ptr(fmt.Sprintf("scale-node-%d", k%500)),
					TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("pod-%07d", k)},
				})
			}
			_, err := c.admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d EndpointSlices of %d endpoints (Services: %v) in %v", n, scaleEndpoints, withServices, time.Since(start).Round(time.Millisecond))
}
