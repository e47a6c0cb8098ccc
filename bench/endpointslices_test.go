package main

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestSeededEndpointSlice: each scale Service's EndpointSlice names its Service as the controller
// does, carries the Service's target ports, and its endpoints are ready, on distinct nodes, with
// addresses no other seeded slice has.
func TestSeededEndpointSlice(t *testing.T) {
	tmpl := lbService("svc-00000")
	seen := map[string]int{}
	for i := range 50000 {
		s := seededEndpointSlice(tmpl, i)
		if s.Labels[discoveryv1.LabelServiceName] != scaleName(i) || s.Namespace != scaleNamespace(i) || s.AddressType != discoveryv1.AddressTypeIPv4 {
			t.Fatalf("slice %d: %s/%s labels %v, address type %s", i, s.Namespace, s.Name, s.Labels, s.AddressType)
		}
		if len(s.Ports) != 1 || *s.Ports[0].Port != 8080 || *s.Ports[0].Name != "http" {
			t.Fatalf("slice %d: ports %+v, want the Service's target port 8080 named http", i, s.Ports)
		}
		if len(s.Endpoints) != endpointsPerSlice || *s.Endpoints[0].NodeName == *s.Endpoints[1].NodeName {
			t.Fatalf("slice %d: endpoints %+v", i, s.Endpoints)
		}
		for _, e := range s.Endpoints {
			if !*e.Conditions.Ready {
				t.Fatalf("slice %d: endpoint %v not ready", i, e.Addresses)
			}
			if j, dup := seen[e.Addresses[0]]; dup {
				t.Fatalf("slices %d and %d both have endpoint %s", j, i, e.Addresses[0])
			}
			seen[e.Addresses[0]] = i
		}
	}
}
