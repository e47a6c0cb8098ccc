package main

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
)

// etcdEndpointSlicesKey is where kube-apiserver keeps EndpointSlices.
const etcdEndpointSlicesKey = "/registry/endpointslices/"

// endpointsPerSlice is how many ready endpoints each seeded EndpointSlice holds, on as many nodes.
const endpointsPerSlice = 2

// seedEndpointSlices writes, into etcd, the EndpointSlice the EndpointSlice controller would make for
// each of the first n scale Services with endpointsPerSlice ready Pods on different nodes. The
// fleet's control plane runs no controller-manager; without them kube-proxy's members (which watch
// EndpointSlices; the agent's do not) received no EndpointSlice and their figure was a lower bound.
// It waits until the apiserver lists them all.
func (c *cluster) seedEndpointSlices(ctx context.Context, n int) error {
	tmpl, _, err := c.templates(ctx)
	if err != nil {
		return err
	}
	var kvs [][2][]byte
	for i := range n {
		s := seededEndpointSlice(tmpl, i)
		b, err := encodeForStorage(s)
		if err != nil {
			return err
		}
		kvs = append(kvs, [2][]byte{[]byte(etcdEndpointSlicesKey + s.Namespace + "/" + s.Name), b})
	}
	if err := newEtcdKV(c.cp).put(ctx, kvs); err != nil {
		return fmt.Errorf("write EndpointSlices to etcd: %w", err)
	}
	return waitCount(ctx, n, "EndpointSlices", func(ns string, opts metav1.ListOptions) (runtime.Object, error) {
		return c.client.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
	})
}

// seededEndpointSlice is the EndpointSlice of the i-th scale Service (tmpl's ports, its target
// port), as the EndpointSlice controller names, labels and owns it: endpointsPerSlice ready IPv4
// endpoints, Pod IPs from 10.128.0.0/9 (distinct up to 8 million endpoints), on nodes fleet-node-0,
// fleet-node-1, ….
func seededEndpointSlice(tmpl *corev1.Service, i int) *discoveryv1.EndpointSlice {
	svcName := scaleName(i)
	ready := true
	var ports []discoveryv1.EndpointPort
	for _, p := range tmpl.Spec.Ports {
		ports = append(ports, discoveryv1.EndpointPort{Name: new(p.Name), Protocol: new(p.Protocol), Port: new(p.TargetPort.IntVal)})
	}
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: scaleNamespace(i), Name: svcName + "-" + string(uuid.NewUUID())[:5], UID: uuid.NewUUID(),
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svcName,
				discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
			// The seeded Services' UIDs are not kept (no garbage collector runs here): a fresh one.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svcName, UID: uuid.NewUUID(),
				Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for e := range endpointsPerSlice {
		k := uint32(i*endpointsPerSlice + e)
		a := netip.AddrFrom4([4]byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)})
		node := fmt.Sprintf("fleet-node-%d", e)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{a.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: new(false)},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: s.Namespace, Name: fmt.Sprintf("%s-%d", svcName, e), UID: uuid.NewUUID()},
		})
	}
	return s
}
