package testkit

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// IncrementalOptions tunes CheckIncremental. Zero values take the defaults.
type IncrementalOptions struct {
	Seeds int // independent random sequences (default 10)
	Steps int // Service events per sequence (default 150)
}

// CheckIncremental is the property test for fixes that read Services: for random sequences of
// Service events (create, update of ports, addresses, type and ipMode, delete, re-create; and now
// and then a change of the Node's pod CIDRs and addresses), applied
// the way an informer applies them (a changed Service is a new object, never modified in place), one
// long-lived fix's Rules must equal, after every event and in both families, those of a fix created
// for that snapshot alone: the rules as Format prints them and the report, byte for byte. newFix
// returns a new, configured fix each time. A small pool of names, addresses and ports makes
// conflicts between Services frequent.
func CheckIncremental(t *testing.T, newFix func() fix.RuleFix, o IncrementalOptions) {
	t.Helper()
	if o.Seeds == 0 {
		o.Seeds = 10
	}
	if o.Steps == 0 {
		o.Steps = 150
	}
	// The node changes too, now and then: what a fix reads from it besides the Services (pod CIDRs,
	// addresses) must make it recompute what depends on it.
	nodes := []*corev1.Node{
		Node("node-a", PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64")),
		Node("node-a", PodCIDRs("203.0.113.8/30", "fd00:10:244:1::/64"), func(n *corev1.Node) {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "203.0.113.10"},
				{Type: corev1.NodeInternalIP, Address: "2001:db8:e::11"}}
		}),
	}
	node := nodes[0]
	for seed := range o.Seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
		live := newFix()
		cluster := map[string]*corev1.Service{}
		compact := map[*corev1.Service]*fix.Service{}
		var history []string
		for step := range o.Steps {
			if rng.IntN(20) == 0 {
				node = nodes[rng.IntN(len(nodes))]
				history = append(history, "node "+strings.Join(node.Spec.PodCIDRs, ","))
			} else {
				history = append(history, randomEvent(rng, cluster))
			}
			// An unchanged Service is the same compact object in every snapshot, as the watch keeps it.
			snap := Snapshot(WithNode(node))
			var list []*fix.Service
			for _, s := range cluster {
				if compact[s] == nil {
					compact[s] = fix.ServiceFrom(s)
				}
				list = append(list, compact[s])
			}
			SortServices(list)
			inputs.Services.Set(snap, list)
			got, want := rulesDump(t, live, snap), rulesDump(t, newFix(), snap)
			if got != want {
				t.Fatalf("seed %d step %d: the long-lived fix differs from a fresh one after these events:\n  %s\n--- long-lived:\n%s\n--- fresh:\n%s",
					seed, step, strings.Join(history, "\n  "), got, want)
			}
		}
	}
}

func rulesDump(t *testing.T, f fix.RuleFix, snap *fix.Snapshot) string {
	t.Helper()
	var b strings.Builder
	for _, fam := range rules.Families {
		rs, report, err := f.Rules(snap, fam)
		if err != nil {
			t.Fatalf("%s: Rules(%s): %v", f.ID(), fam, err)
		}
		b.WriteString(FormatResult(rs, report))
	}
	return b.String()
}

// randomEvent changes cluster by one event and describes it.
func randomEvent(rng *rand.Rand, cluster map[string]*corev1.Service) string {
	ns := []string{"a", "b"}[rng.IntN(2)]
	name := fmt.Sprintf("svc-%d", rng.IntN(6))
	key := ns + "/" + name
	old, exists := cluster[key]
	switch {
	case !exists:
		cluster[key] = randomService(rng, ns, name)
		return "create " + key
	case rng.IntN(4) == 0:
		delete(cluster, key)
		return "delete " + key
	}
	// An update: a new object from a copy, as an informer delivers it.
	svc := old.DeepCopy()
	what := ""
	switch rng.IntN(6) {
	case 0:
		svc.Spec.Ports = randomPorts(rng)
		what = "ports"
	case 1:
		svc.Status.LoadBalancer.Ingress = randomIngress(rng)
		what = "ingress IPs"
	case 2:
		svc.Spec.ExternalIPs = randomAddrs(rng, 2)
		what = "externalIPs"
	case 3:
		if len(svc.Status.LoadBalancer.Ingress) > 0 {
			i := rng.IntN(len(svc.Status.LoadBalancer.Ingress))
			svc.Status.LoadBalancer.Ingress[i].IPMode = randomIPMode(rng)
		}
		what = "ipMode"
	case 4:
		svc.Spec.Type = []corev1.ServiceType{corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeClusterIP,
			corev1.ServiceTypeNodePort, corev1.ServiceTypeExternalName}[rng.IntN(4)]
		what = "type"
	default:
		svc = randomService(rng, ns, name) // deleted and re-created between two syncs
		what = "re-create"
	}
	cluster[key] = svc
	return fmt.Sprintf("update %s (%s)", key, what)
}

var (
	randomV4 = []string{"203.0.113.10", "203.0.113.11", "203.0.113.12", "::ffff:203.0.113.12", "203.0.113.999"}
	randomV6 = []string{"2001:db8:e::10", "2001:db8:e::11", "2001:db8:e::zz"}
)

func randomService(rng *rand.Rand, ns, name string) *corev1.Service {
	var mods []func(*corev1.Service)
	switch rng.IntN(8) {
	case 0:
		mods = append(mods, ClusterIPs("10.96.0."+fmt.Sprint(rng.IntN(3)+1)))
	case 1:
		mods = append(mods, ClusterIPs("fd00:10:96::"+fmt.Sprint(rng.IntN(3)+1)))
	case 2:
		mods = append(mods, Headless())
	case 3:
		mods = append(mods, ClusterIPs("not-an-ip"))
	default:
		mods = append(mods, ClusterIPs("10.96.0."+fmt.Sprint(rng.IntN(3)+1), "fd00:10:96::"+fmt.Sprint(rng.IntN(3)+1)))
	}
	svc := Service(ns, name, mods...)
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	if rng.IntN(5) == 0 {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	svc.Status.LoadBalancer.Ingress = randomIngress(rng)
	if rng.IntN(3) == 0 {
		svc.Spec.ExternalIPs = randomAddrs(rng, 2)
	}
	svc.Spec.Ports = randomPorts(rng)
	return svc
}

func randomAddrs(rng *rand.Rand, max int) []string {
	var out []string
	for range rng.IntN(max + 1) {
		if rng.IntN(3) == 0 {
			out = append(out, randomV6[rng.IntN(len(randomV6))])
		} else {
			out = append(out, randomV4[rng.IntN(len(randomV4))])
		}
	}
	return out
}

func randomIngress(rng *rand.Rand) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for _, ip := range randomAddrs(rng, 3) {
		out = append(out, corev1.LoadBalancerIngress{IP: ip, IPMode: randomIPMode(rng)})
	}
	if rng.IntN(6) == 0 {
		out = append(out, corev1.LoadBalancerIngress{Hostname: "lb.example.com"})
	}
	return out
}

func randomIPMode(rng *rand.Rand) *corev1.LoadBalancerIPMode {
	switch rng.IntN(3) {
	case 0:
		return nil
	case 1:
		return new(corev1.LoadBalancerIPModeVIP)
	}
	return new(corev1.LoadBalancerIPModeProxy)
}

func randomPorts(rng *rand.Rand) []corev1.ServicePort {
	var out []corev1.ServicePort
	for i := range rng.IntN(3) + 1 {
		p := corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: []int32{80, 443, 53, 0}[rng.IntN(4)],
			Protocol: []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, "", "ICMP"}[rng.IntN(4)]}
		out = append(out, p)
	}
	return slices.Clip(out)
}
