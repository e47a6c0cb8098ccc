package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

const (
	// namespace holds the Services of the change-latency phase (chg-NNNN). It sorts before every
	// scale namespace, so a budget that is full at the largest N lets the change Services in first.
	namespace = "bench"
	svcPort   = 80
)

// The scale Services are spread over namespaces of at most scalePerNamespace each: core/fix
// programs at most a backend's namespace budget of entries per family for one namespace's Services
// (one entry per scale Service), and half of the lowest (fix.MinBudget) leaves room without coming
// near it on any backend.
var scalePerNamespace = fix.MinBudget().PerNamespace / 2

// scaleNamespace is the namespace of the i-th scale Service: bench-scale-0 holds svc-00000 ..
// svc-<scalePerNamespace-1>, and so on.
func scaleNamespace(i int) string { return fmt.Sprintf("bench-scale-%d", i/scalePerNamespace) }

// scaleNamespaces are the namespaces the first n scale Services live in.
func scaleNamespaces(n int) []string {
	var out []string
	for i := 0; i < n; i += scalePerNamespace {
		out = append(out, scaleNamespace(i))
	}
	return out
}

// ensureNamespaces creates the namespaces of the first n scale Services through the API (taking
// those that exist), before any Service is written into them, through the API or into etcd.
func (c *cluster) ensureNamespaces(ctx context.Context, n int) error {
	for _, ns := range scaleNamespaces(n) {
		err := retry(ctx, func() error {
			_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	return nil
}

// Address plan (documentation and private ranges, never routed anywhere: the agent only puts them
// into rules inside a throw-away namespace).
var (
	// Ingress IP of the i-th scale Service: 172.16.0.0 + i + 1.
	scaleBase = netip.MustParseAddr("172.16.0.0")
	// Ingress IPs of the Services of the change-latency phase: created with 172.31.0.0 + k + 1,
	// updated to 172.30.0.0 + k + 1.
	createBase = netip.MustParseAddr("172.31.0.0")
	updateBase = netip.MustParseAddr("172.30.0.0")
)

func nthAddr(base netip.Addr, i int) netip.Addr {
	a := base.As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

type cluster struct {
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	have   int // scale Services svc-00000 .. svc-<have-1> exist with their ingress IP
	// hostileUpdates is how many times the hostile Services changed their ingress IPs (hostile.go).
	hostileUpdates int
}

func newCluster(cp *controlplane.ControlPlane) (*cluster, error) {
	cfg := cp.AdminRESTConfig()
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	_, err = client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace: %w", err)
	}
	return &cluster{cp: cp, client: client}, nil
}

// Every scale Service has externalTrafficPolicy Local, so the apiserver gives it a health-check node
// port: the range must hold the largest N (the control plane's default, 20000-65535, stops at 45,536).
const scaleNodePortRange = "1024-65535"

var (
	scaleNodePortSpan = utilnet.ParsePortRangeOrDie(scaleNodePortRange)
	// scaleNodePortBase is the range's first port; scaleNodePorts is how many Services it holds.
	scaleNodePortBase, scaleNodePorts = scaleNodePortSpan.Base, scaleNodePortSpan.Size
)

// lbService is a LoadBalancer Service as the scale test wants it: externalTrafficPolicy Local (so the
// apiserver allocates a health-check node port from the node-port range), no node ports for the
// traffic ports, IPv4 single-stack, one TCP port.
func lbService(name string) *corev1.Service {
	single := corev1.IPFamilyPolicySingleStack
	no := false
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:                          corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy:         corev1.ServiceExternalTrafficPolicyLocal,
			AllocateLoadBalancerNodePorts: &no,
			IPFamilyPolicy:                &single,
			IPFamilies:                    []corev1.IPFamily{corev1.IPv4Protocol},
			Selector:                      map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

func withIngress(svc *corev1.Service, ip netip.Addr) *corev1.Service {
	out := svc.DeepCopy()
	out.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String()}}
	return out
}

// createScale creates the i-th scale Service with its ingress IP. A loaded machine makes the
// apiserver time out now and then (a write that timed out may still have happened): such errors are
// retried, and a Service that already exists is taken as it is.
func (c *cluster) createScale(ctx context.Context, i int) error {
	name, ns := scaleName(i), scaleNamespace(i)
	svcs := c.client.CoreV1().Services(ns)
	obj := lbService(name)
	obj.Namespace = ns
	var svc *corev1.Service
	err := retry(ctx, func() error {
		var err error
		svc, err = svcs.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			svc, err = svcs.Get(ctx, name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("create %s/%s: %w", ns, name, err)
	}
	err = retry(ctx, func() error {
		_, err := svcs.UpdateStatus(ctx, withIngress(svc, nthAddr(scaleBase, i)), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if cur, gerr := svcs.Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				svc = cur
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("status of %s/%s: %w", ns, name, err)
	}
	return nil
}

// retry runs f until it succeeds, fails with an error that a retry cannot help, or 10 attempts.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		if err = f(); err == nil || ctx.Err() != nil {
			return err
		}
		if !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTooManyRequests(err) &&
			!apierrors.IsConflict(err) && !apierrors.IsInternalError(err) && !apierrors.IsServiceUnavailable(err) {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 200 * time.Millisecond)
	}
	return err
}
