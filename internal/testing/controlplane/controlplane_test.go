package controlplane

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

func TestControlPlane(t *testing.T) {
	cp := StartT(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := cp.AdminClient()

	svc := createDualStackLoadBalancer(ctx, t, admin)
	setIngress(ctx, t, admin, svc)

	t.Run("ServiceAccountWithoutRBACIsForbidden", func(t *testing.T) {
		path, err := cp.ServiceAccountKubeconfig(ctx, "nnm-system", "agent", "")
		if err != nil {
			t.Fatal(err)
		}
		sa := clientFromKubeconfig(t, path, "")
		_, err = sa.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("listing services without RBAC: got %v, want Forbidden", err)
		}
		t.Logf("as expected: %v", err)
	})

	t.Run("ServiceAccountFromNodeNetnsWithRBAC", func(t *testing.T) {
		node := newNodeNetns(t)
		path, err := cp.ServiceAccountKubeconfig(ctx, "nnm-system", "agent", node)
		if err != nil {
			t.Fatal(err)
		}
		grantListServices(ctx, t, admin, "nnm-system", "agent")
		sa := clientFromKubeconfig(t, path, node)
		agenttest.Eventually(t, 10*time.Second, func() error {
			_, err := sa.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			return err
		})
		nodeAdmin, err := cp.ConnectNamespace(node)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := clientFromKubeconfig(t, nodeAdmin, node).CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Fatalf("admin kubeconfig from node netns: %v", err)
		}
	})

	t.Run("APIServerRestartKeepsData", func(t *testing.T) {
		if err := cp.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{}); err == nil {
			t.Fatal("apiserver still answers after StopAPIServer")
		}
		if err := cp.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := admin.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get service after restart: %v", err)
		}
		if len(got.Status.LoadBalancer.Ingress) != 2 || len(got.Spec.ClusterIPs) != 2 {
			t.Fatalf("service lost data across restart: %+v / %v", got.Status.LoadBalancer, got.Spec.ClusterIPs)
		}
	})
}

func TestCloseRemovesEverything(t *testing.T) {
	cp := StartT(t, Options{})
	node := newNodeNetns(t)
	if _, err := cp.ConnectNamespace(node); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane %s at %s", cp.Netns(), cp.Server())
	etcd, apiserver := cp.etcd, cp.apiserver
	for i := range 2 { // Close must be idempotent
		if err := cp.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if netns.Exists(cp.Netns()) {
		t.Errorf("netns %s still exists", cp.Netns())
	}
	if err := exec.Command("ip", "link", "show", cp.hostLink.local).Run(); err == nil {
		t.Errorf("host veth %s still exists", cp.hostLink.local)
	}
	if err := exec.Command("ip", "-n", node, "link", "show", cp.hostLink.local).Run(); err == nil {
		t.Errorf("node veth %s still exists in %s", cp.hostLink.local, node)
	}
	for _, p := range []*process{etcd, apiserver} {
		if p.exitError() == nil {
			t.Errorf("%s (pid %d) still running", p.name, p.cmd.Process.Pid)
		}
	}
	if _, err := os.Stat(cp.DataDir()); !os.IsNotExist(err) {
		t.Errorf("data dir %s still exists (%v)", cp.DataDir(), err)
	}
}

func createDualStackLoadBalancer(ctx context.Context, t *testing.T, cs kubernetes.Interface) *corev1.Service {
	t.Helper()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			IPFamilyPolicy:                &policy,
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			AllocateLoadBalancerNodePorts: ptr(false),
			Selector:                      map[string]string{"app": "web"},
			Ports:                         []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	got, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service: %v", err)
	}
	if len(got.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs = %v, want one per family", got.Spec.ClusterIPs)
	}
	v4, v6 := netip.MustParseAddr(got.Spec.ClusterIPs[0]), netip.MustParseAddr(got.Spec.ClusterIPs[1])
	if !v4.Is4() || !v6.Is6() {
		t.Fatalf("clusterIPs = %v, want IPv4 then IPv6", got.Spec.ClusterIPs)
	}
	if got.Spec.HealthCheckNodePort == 0 || got.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("healthCheckNodePort=%d nodePort=%d, want a health-check port and no node port",
			got.Spec.HealthCheckNodePort, got.Spec.Ports[0].NodePort)
	}
	t.Logf("service %s/%s: clusterIPs %v, healthCheckNodePort %d", got.Namespace, got.Name, got.Spec.ClusterIPs, got.Spec.HealthCheckNodePort)
	return got
}

func setIngress(ctx context.Context, t *testing.T, cs kubernetes.Interface, svc *corev1.Service) {
	t.Helper()
	vip := corev1.LoadBalancerIPModeVIP
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
		{IP: "203.0.113.10", IPMode: &vip},
		{IP: "2001:db8::10", IPMode: &vip},
	}
	got, err := cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update service status: %v", err)
	}
	if len(got.Status.LoadBalancer.Ingress) != 2 {
		t.Fatalf("ingress = %+v", got.Status.LoadBalancer.Ingress)
	}
}

func grantListServices(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, sa string) {
	t.Helper()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "nnm-test-list-services"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list"}}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// clientFromKubeconfig builds a clientset; with nodeNS set its connections
// are made from inside that netns, like an agent running there.
func clientFromKubeconfig(t *testing.T, path, nodeNS string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if nodeNS != "" {
		cfg.Dial = netns.DialContext(netns.Path(nodeNS), nil)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// newNodeNetns creates a netns standing in for a node; removed at cleanup.
func newNodeNetns(t *testing.T) string {
	t.Helper()
	return netns.New(t, "nnm-cptest-node").Name
}

func TestNthSlash30(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
		ok   bool
	}{{0, "198.18.0.0/30", true}, {1, "198.18.0.4/30", true}, {64, "198.18.1.0/30", true}, {16383, "198.18.255.252/30", true}, {16384, "", false}} {
		got, ok := nthSlash30(nodeLinkRange, tc.n)
		if ok != tc.ok || (ok && got.String() != tc.want) {
			t.Errorf("nthSlash30(%d) = %v, %v; want %s, %v", tc.n, got, ok, tc.want, tc.ok)
		}
	}
	l := vethLink{prefix: netip.MustParsePrefix("198.18.0.4/30")}
	if l.localIP().String() != "198.18.0.5" || l.peerIP().String() != "198.18.0.6" {
		t.Errorf("link IPs = %v, %v", l.localIP(), l.peerIP())
	}
}

func TestParseNetnetns(t *testing.T) {
	pid, id, ok := parseNetnetns("nnm-cp-1234-abcdef")
	if !ok || pid != 1234 || id != "abcdef" {
		t.Errorf("got %d %q %v", pid, id, ok)
	}
	for _, bad := range []string{"nnm-cp-x-abc", "nnm-cp-12", "other-1-ab", "nnm-cp-12-"} {
		if _, _, ok := parseNetnetns(bad); ok {
			t.Errorf("parseNetnetns(%q) accepted", bad)
		}
	}
	if n := hostVethName("abcdef"); len(n) > 15 {
		t.Errorf("host veth name %q longer than IFNAMSIZ-1", n)
	}
}

func TestOverlapsAny(t *testing.T) {
	used := []netip.Prefix{netip.MustParsePrefix("198.19.0.0/24"), netip.MustParsePrefix("0.0.0.0/0")}
	if !overlapsAny(netip.MustParsePrefix("198.19.0.4/30"), used) {
		t.Error("overlap not found")
	}
	if overlapsAny(netip.MustParsePrefix("198.19.1.4/30"), used) {
		t.Error("default route must not count as overlap")
	}
}
