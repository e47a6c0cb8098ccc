package main

// Seeding scale Services straight into etcd.
//
// kube-apiserver (1.33 and later) allocates ClusterIPs as IPAddress objects, and after every
// allocation it sets its metrics from Used() and Free(), each of which lists every IPAddress of the
// family: O(N) per Service, so creating 50,000 took about 80 minutes here (BENCHMARKS.md). What the
// bench measures is the agent, not that allocator. So the first scale Service is created through the
// API, and the others are written into etcd as copies of it: the bytes the apiserver itself stores
// (protobuf, the same managed fields), each with its own name, UID, ClusterIP, health-check node port
// and ingress IP, plus what the apiserver's allocators would have recorded (an IPAddress object per
// ClusterIP, the node port's bit in the allocation bitmap), so its repair controllers find nothing to
// repair and later API creations allocate around them. The apiserver's watch cache sees these writes
// as it sees its own, and the agent lists and watches them through the apiserver as usual.
//
// etcd is reached through its JSON gateway (/v3/kv/...): two endpoints, no etcd client module in the
// agent's go.mod for a benchmark.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

const (
	// etcd keys as kube-apiserver lays them out (its default --etcd-prefix).
	etcdServicesKey  = "/registry/services/specs/"
	etcdIPAddressKey = "/registry/ipaddresses/"
	etcdNodePortsKey = "/registry/ranges/servicenodeports"
	// etcd's default --max-txn-ops.
	etcdMaxTxnOps = 128
)

var storageCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// etcdKV is the little of etcd's v3 API the seeding needs, over its JSON gateway.
type etcdKV struct {
	url    string
	client *http.Client
}

func newEtcdKV(cp *controlplane.ControlPlane) etcdKV {
	url, client := cp.Etcd()
	return etcdKV{url: url, client: client}
}

func (e etcdKV) call(ctx context.Context, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	res, err := e.client.Do(r)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, res.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, resp)
}

// get returns the value of key (nil if it does not exist).
func (e etcdKV) get(ctx context.Context, key string) ([]byte, error) {
	var resp struct {
		KVs []struct {
			Value []byte `json:"value"` // base64 in JSON, as encoding/json does []byte
		} `json:"kvs"`
	}
	if err := e.call(ctx, "/v3/kv/range", map[string]any{"key": []byte(key)}, &resp); err != nil {
		return nil, err
	}
	if len(resp.KVs) == 0 {
		return nil, nil
	}
	return resp.KVs[0].Value, nil
}

// put writes the pairs in transactions of at most etcdMaxTxnOps puts.
func (e etcdKV) put(ctx context.Context, kvs [][2][]byte) error {
	for len(kvs) > 0 {
		n := min(len(kvs), etcdMaxTxnOps)
		ops := make([]map[string]any, n)
		for i, kv := range kvs[:n] {
			ops[i] = map[string]any{"request_put": map[string]string{
				"key":   base64.StdEncoding.EncodeToString(kv[0]),
				"value": base64.StdEncoding.EncodeToString(kv[1]),
			}}
		}
		var resp struct {
			Succeeded bool `json:"succeeded"`
		}
		if err := e.call(ctx, "/v3/kv/txn", map[string]any{"success": ops}, &resp); err != nil {
			return err
		}
		if !resp.Succeeded {
			return fmt.Errorf("etcd txn of %d puts did not succeed", n)
		}
		kvs = kvs[n:]
	}
	return nil
}

func encodeForStorage(obj runtime.Object) ([]byte, error) {
	var b bytes.Buffer
	if err := storageCodec.Encode(obj, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// seedServices brings the scale Services up to n: their namespaces first, then svc-00000 through the
// API (the template), the others written into etcd, then waits until the apiserver lists all n.
func (c *cluster) seedServices(ctx context.Context, n int) error {
	if err := c.ensureNamespaces(ctx, max(n, 1)); err != nil {
		return err
	}
	if c.have == 0 {
		if err := c.createScale(ctx, 0); err != nil {
			return err
		}
		c.have = 1
	}
	if n <= c.have {
		return nil
	}
	tmpl, ipTmpl, err := c.templates(ctx)
	if err != nil {
		return err
	}
	ips, ports, err := c.free(ctx)
	if err != nil {
		return err
	}
	var kvs [][2][]byte
	var newPorts []int
	for i := c.have; i < n; i++ {
		ip, ok := ips.next()
		if !ok {
			return fmt.Errorf("scale Service %d: the Service CIDR %s has no free address left", i, ips.prefix)
		}
		port, ok := ports.next()
		if !ok {
			return fmt.Errorf("scale Service %d: the node-port range %s has no free port left", i, scaleNodePortRange)
		}
		svc, addr := seededService(tmpl, ipTmpl, i, ip, port)
		for _, kv := range []struct {
			key string
			obj runtime.Object
		}{{etcdIPAddressKey + addr.Name, addr}, {etcdServicesKey + svc.Namespace + "/" + svc.Name, svc}} {
			b, err := encodeForStorage(kv.obj)
			if err != nil {
				return err
			}
			kvs = append(kvs, [2][]byte{[]byte(kv.key), b})
		}
		newPorts = append(newPorts, port)
	}
	etcd := newEtcdKV(c.cp)
	// The allocations first, then the Services that hold them.
	if err := c.markNodePorts(ctx, etcd, newPorts); err != nil {
		return err
	}
	if err := etcd.put(ctx, kvs); err != nil {
		return fmt.Errorf("write scale Services to etcd: %w", err)
	}
	if err := c.waitListed(ctx, n); err != nil {
		return err
	}
	c.have = n
	return nil
}

// templates returns svc-00000 and its IPAddress as the apiserver stored them.
func (c *cluster) templates(ctx context.Context) (*corev1.Service, *networkingv1.IPAddress, error) {
	tmpl, err := c.client.CoreV1().Services(scaleNamespace(0)).Get(ctx, scaleName(0), metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("template Service: %w", err)
	}
	ipTmpl, err := c.client.NetworkingV1().IPAddresses().Get(ctx, tmpl.Spec.ClusterIP, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("template Service's IPAddress: %w", err)
	}
	return tmpl, ipTmpl, nil
}

// seededService is the i-th scale Service (in scaleNamespace(i)) and its IPAddress, copied from the
// templates.
func seededService(tmpl *corev1.Service, ipTmpl *networkingv1.IPAddress, i int, ip netip.Addr, port int) (*corev1.Service, *networkingv1.IPAddress) {
	name := scaleName(i)
	svc := tmpl.DeepCopy()
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	svc.Namespace, svc.Name, svc.UID, svc.ResourceVersion = scaleNamespace(i), name, uuid.NewUUID(), ""
	svc.Spec.Selector = map[string]string{"app": name}
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip.String(), []string{ip.String()}
	svc.Spec.HealthCheckNodePort = int32(port)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: nthAddr(scaleBase, i).String()}}

	addr := ipTmpl.DeepCopy()
	addr.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"}
	addr.Name, addr.UID, addr.ResourceVersion = ip.String(), uuid.NewUUID(), ""
	addr.Spec.ParentRef.Namespace, addr.Spec.ParentRef.Name = svc.Namespace, name
	return svc, addr
}

func scaleName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// free returns the ClusterIPs and node ports no Service (and no IPAddress) holds yet.
func (c *cluster) free(ctx context.Context) (*freeAddrs, *freePorts, error) {
	prefix, err := netip.ParsePrefix(strings.Split(controlplane.DefaultServiceClusterIPRange, ",")[0])
	if err != nil {
		return nil, nil, err
	}
	// The range's first address is default/kubernetes's, whether or not kube-apiserver's controller
	// has created that Service yet: seeding it first leaves the cluster without the kubernetes
	// Service ("failed to allocate IP 10.96.0.1: provided IP is already allocated").
	ips := &freeAddrs{prefix: prefix, at: prefix.Addr().Next(), used: map[netip.Addr]bool{prefix.Addr().Next(): true}}
	addrs, err := c.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list IPAddresses: %w", err)
	}
	for _, a := range addrs.Items {
		if ip, err := netip.ParseAddr(a.Name); err == nil {
			ips.used[ip] = true
		}
	}
	ports := &freePorts{at: scaleNodePortBase, used: map[int]bool{}}
	svcs, err := c.client.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list Services: %w", err)
	}
	for _, s := range svcs.Items {
		ports.used[int(s.Spec.HealthCheckNodePort)] = true
		for _, p := range s.Spec.Ports {
			ports.used[int(p.NodePort)] = true
		}
	}
	return ips, ports, nil
}

type freeAddrs struct {
	prefix netip.Prefix
	at     netip.Addr
	used   map[netip.Addr]bool
}

func (f *freeAddrs) next() (netip.Addr, bool) {
	for ; f.prefix.Contains(f.at); f.at = f.at.Next() {
		if a := f.at; !f.used[a] && f.prefix.Contains(a.Next()) { // not the broadcast address
			f.at = a.Next()
			return a, true
		}
	}
	return netip.Addr{}, false
}

type freePorts struct {
	at   int
	used map[int]bool
}

func (f *freePorts) next() (int, bool) {
	for ; f.at < scaleNodePortBase+scaleNodePorts; f.at++ {
		if p := f.at; !f.used[p] {
			f.at++
			return p, true
		}
	}
	return 0, false
}

// markNodePorts sets the ports in the apiserver's node-port allocation bitmap (a RangeAllocation:
// bit k is port base+k), as its allocator would have.
func (c *cluster) markNodePorts(ctx context.Context, etcd etcdKV, ports []int) error {
	b, err := etcd.get(ctx, etcdNodePortsKey)
	if err != nil {
		return err
	}
	if b == nil {
		return fmt.Errorf("etcd has no %s: the apiserver records its node-port allocations elsewhere", etcdNodePortsKey)
	}
	obj, _, err := storageCodec.Decode(b, nil, nil)
	if err != nil {
		return fmt.Errorf("decode %s: %w", etcdNodePortsKey, err)
	}
	ra, ok := obj.(*corev1.RangeAllocation)
	if !ok {
		return fmt.Errorf("%s holds a %T, not a RangeAllocation", etcdNodePortsKey, obj)
	}
	if ra.Range != scaleNodePortRange {
		return fmt.Errorf("%s is for the range %q, not %q", etcdNodePortsKey, ra.Range, scaleNodePortRange)
	}
	bits := new(big.Int).SetBytes(ra.Data)
	for _, p := range ports {
		bits.SetBit(bits, p-scaleNodePortBase, 1)
	}
	ra.Data, ra.ResourceVersion = bits.Bytes(), ""
	ra.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "RangeAllocation"}
	out, err := encodeForStorage(ra)
	if err != nil {
		return err
	}
	return etcd.put(ctx, [][2][]byte{{[]byte(etcdNodePortsKey), out}})
}

// waitListed waits until the apiserver lists n scale Services in their namespaces.
func (c *cluster) waitListed(ctx context.Context, n int) error {
	return waitCount(ctx, n, "scale Services", func(ns string, opts metav1.ListOptions) (runtime.Object, error) {
		return c.client.CoreV1().Services(ns).List(ctx, opts)
	})
}

// waitCount waits until the apiserver lists n objects (what) in the scale namespaces of n Services,
// counted from one item per namespace and the remaining count the apiserver gives with it.
func waitCount(ctx context.Context, n int, what string, list func(ns string, opts metav1.ListOptions) (runtime.Object, error)) error {
	return agenttest.Poll(ctx, 5*time.Minute, 200*time.Millisecond, func() error {
		got := 0
		for _, ns := range scaleNamespaces(n) {
			l, err := list(ns, metav1.ListOptions{Limit: 1})
			if err != nil {
				return err
			}
			got += meta.LenList(l)
			if li, err := meta.ListAccessor(l); err == nil && li.GetRemainingItemCount() != nil {
				got += int(*li.GetRemainingItemCount())
			}
		}
		if got < n {
			return fmt.Errorf("the apiserver lists %d of the %d %s written to etcd", got, n, what)
		}
		return nil
	})
}
