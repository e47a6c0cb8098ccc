package fixes

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// FuzzServiceRules feeds every in-tree fix (default options) a Service built from fuzz input beside
// the Services of testkit.ExampleSnapshot, on a node with fuzzed pod CIDRs: no fix may panic, and
// every ruleset a fix returns passes rules.Validate, the fake backend and renders on both real
// backends. Malformed addresses and ports are what the API server may hold after upgrades or what
// a buggy controller writes; a fix skips them, it does not fail on them.
func FuzzServiceRules(f *testing.F) {
	f.Add(uint8(2), "10.96.0.10,fd00:10:96::10", "198.51.100.7", "203.0.113.10,2001:db8::1", uint8(0), []byte{0, 0, 80, 1, 0, 53}, true, "10.244.1.0/24,fd00:10:244:1::/64")
	f.Add(uint8(2), "10.96.0.10", "", "203.0.113.10", uint8(1), []byte{0, 1, 187}, false, "")
	f.Add(uint8(0), "None", "010.1.2.3,::ffff:1.2.3.4", "0.0.0.0,127.0.0.1,169.254.169.254,ff02::1", uint8(0), []byte{2, 0, 0, 3, 255, 255}, false, "10.244.1.0/33")
	f.Add(uint8(3), "", "", "", uint8(0), []byte{}, false, "garbage")
	f.Add(uint8(1), "10.96.0.11,10.96.0.12", "203.0.113.10", "203.0.113.10", uint8(2), []byte{0, 0, 80, 0, 0, 80}, true, "10.244.1.0/24")

	all, _ := standardFixes(f)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var renderers []interface {
		Name() string
		Render(*rules.Ruleset) (string, error)
	}
	for _, name := range backends.Names {
		be, err := backends.New(name, "nft", log)
		if err != nil {
			f.Fatal(err)
		}
		renderers = append(renderers, be)
	}

	f.Fuzz(func(t *testing.T, kind uint8, clusterIPs, externalIPs, ingress string, ipModes uint8, ports []byte, local bool, podCIDRs string) {
		svc := fuzzService(kind, clusterIPs, externalIPs, ingress, ipModes, ports, local)
		base := testkit.ExampleSnapshot()
		snap := testkit.Snapshot(
			testkit.WithNode(testkit.Node("node-a", testkit.PodCIDRs(split(podCIDRs)...))),
			testkit.WithProxyMode("ipvs"),
			testkit.WithServices(svc))
		svcs := append(inputs.Services.Get(snap), inputs.Services.Get(base)...)
		testkit.SortServices(svcs)
		inputs.Services.Set(snap, svcs)
		for _, fi := range all {
			rf, ok := fi.(fix.RuleFix)
			if !ok {
				continue // an Actuator: no rules
			}
			for _, fam := range rules.Families {
				rs, _, err := rf.Rules(snap, fam)
				if err != nil || rs == nil {
					continue // an error names the cause; the engine keeps what was programmed
				}
				if err := rs.Validate(); err != nil {
					t.Fatalf("%s %s: invalid ruleset for %+v: %v\n%s", fi.ID(), fam, svc.Spec, err, testkit.Format(rs))
				}
				if err := testkit.Apply(t.Context(), testkit.NewFakeBackend(), rs); err != nil {
					t.Fatalf("%s %s: the fake backend rejects the ruleset: %v\n%s", fi.ID(), fam, err, testkit.Format(rs))
				}
				for _, r := range renderers {
					if _, err := r.Render(rs); err != nil {
						t.Fatalf("%s %s: %s cannot render the ruleset: %v\n%s", fi.ID(), fam, r.Name(), err, testkit.Format(rs))
					}
				}
			}
		}
	})
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// fuzzService builds a Service in namespace "fuzz" from the fuzz input: kind picks the type, the
// address lists are comma-separated and taken as they come, ipModes gives ingress i ipMode Proxy
// when bit i is set (VIP when bit i+4 is), and ports are read three bytes each (protocol, port).
func fuzzService(kind uint8, clusterIPs, externalIPs, ingress string, ipModes uint8, ports []byte, local bool) *corev1.Service {
	svc := testkit.Service("fuzz", "svc")
	svc.Spec.Type = []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort,
		corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}[kind%4]
	if ips := split(clusterIPs); len(ips) > 0 {
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ips[0], ips
	}
	svc.Spec.ExternalIPs = split(externalIPs)
	for i, ip := range split(ingress) {
		in := corev1.LoadBalancerIngress{IP: ip}
		switch {
		case i < 4 && ipModes&(1<<i) != 0:
			in.IPMode = ptr(corev1.LoadBalancerIPModeProxy)
		case i < 4 && ipModes&(1<<(i+4)) != 0:
			in.IPMode = ptr(corev1.LoadBalancerIPModeVIP)
		}
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, in)
	}
	if local {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	protocols := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, "ICMP"}
	for i := 0; i+2 < len(ports) && i < 3*8; i += 3 {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Protocol: protocols[ports[i]%4],
			Port:     int32(ports[i+1])<<8 | int32(ports[i+2]),
		})
	}
	return svc
}

func ptr[T any](v T) *T { return &v }
