package diagnose

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// otherMode is the finding of a check of kube-proxy's mode want on a node where kube-proxy runs
// another mode (ok), none (ok), or an unknown one (cannot tell); other is false when it runs want.
func otherMode(env *Env, want string) (f Finding, other bool) {
	switch env.ProxyMode {
	case want:
		return Finding{}, false
	case "":
		return cannot("kube-proxy's mode is unknown (set proxyMode)"), true
	case fix.ProxyModeNone:
		return Finding{State: OK, Summary: "no kube-proxy on this node"}, true
	}
	return Finding{State: OK, Summary: "kube-proxy runs in " + env.ProxyMode + " mode, not " + want}, true
}

// ipvsExternalIPCheck: kube-proxy IPVS mode blackholes External-IPs of eTP=Local Services without a
// local endpoint for the node's own traffic (kubernetes#75262).
type ipvsExternalIPCheck struct{}

func (ipvsExternalIPCheck) ID() string { return "ipvs-external-ip" }
func (ipvsExternalIPCheck) Title() string {
	return "kube-proxy IPVS mode: External-IPs of externalTrafficPolicy: Local Services without a local endpoint are unreachable from this node (kubernetes#75262)"
}

// BlackholedExternalIPs lists "namespace/name address" for each External-IP (LoadBalancer ingress
// IP of a LoadBalancer, spec.externalIPs) of a Service with externalTrafficPolicy: Local and no
// ready endpoint on node: the addresses IPVS mode binds on kube-ipvs0 and serves with no endpoint.
func BlackholedExternalIPs(svcs []*fix.Service, slices []*discoveryv1.EndpointSlice, node string) []string {
	var out []string
	for _, s := range svcs {
		if !s.LocalTrafficPolicy || s.Headless {
			continue
		}
		var addrs []netip.Addr
		if s.Type == fix.ServiceTypeLoadBalancer {
			for _, in := range s.Ingress {
				if !in.Proxy {
					addrs = append(addrs, in.IP)
				}
			}
		}
		addrs = append(addrs, s.ExternalIPs...)
		if len(addrs) == 0 || inputs.LocalEndpoints(slices, s.Namespace, s.Name, node) > 0 {
			continue
		}
		for _, a := range addrs {
			out = append(out, s.Key()+" "+a.String())
		}
	}
	sort.Strings(out)
	return out
}

func (ipvsExternalIPCheck) Run(ctx context.Context, env *Env) Finding {
	if f, other := otherMode(env, "ipvs"); other {
		return f
	}
	// ipvs-externalip-dnat's work leaves nothing a check could read without its backend's record:
	// its last sync, which reads its rules back, is the proof.
	dnat, why, evs := env.inForce(ctx, fixIPVS, nil)
	for _, t := range []fix.TableRef{inputs.Services, inputs.EndpointSlices} {
		if miss := env.missing(t); miss != "" {
			if dnat {
				return Finding{State: Handled, HandledBy: fixIPVS, Evidence: evs, Summary: "ipvs-externalip-dnat sends this node's traffic to every External-IP of an externalTrafficPolicy: Local Service through the Cluster-IP (" + t.Name() + " not read: " + miss + ")"}
			}
			f := cannot("%s cannot be read: %s", t.Name(), miss)
			notInForce(&f, why)
			return f
		}
	}
	if env.Node == "" {
		return cannot("the node name is unknown (nodeName / NNM_NODE_NAME): local endpoints cannot be told")
	}
	hit := BlackholedExternalIPs(inputs.Services.Get(env.Cluster), inputs.EndpointSlices.Get(env.Cluster), env.Node)
	f := Finding{Remedy: "enable ipvs-externalip-dnat (on by default in IPVS mode)",
		Evidence: []Evidence{ev("External-IPs without a local endpoint (eTP Local)", "%d", len(hit))}}
	for i, h := range hit {
		if i == StaleExamples {
			f.Evidence = append(f.Evidence, ev("more", "%d", len(hit)-i))
			break
		}
		f.Evidence = append(f.Evidence, ev("service", "%s", h))
	}
	f.Evidence = append(f.Evidence, evs...)
	notInForce(&f, why)
	switch {
	case len(hit) == 0:
		f.State, f.Remedy, f.Summary = OK, "", "every External-IP of an externalTrafficPolicy: Local Service has an endpoint on this node"
	case dnat:
		f.State, f.HandledBy = Handled, fixIPVS
		f.Summary = fmt.Sprintf("%s have no local endpoint; ipvs-externalip-dnat sends this node's traffic to them through the Cluster-IP", plural(len(hit), "External-IP"))
	default:
		f.State = Problem
		f.Summary = fmt.Sprintf("%s without a local endpoint: host-network processes (and pods, before kubernetes#97081) on this node cannot reach them", plural(len(hit), "External-IP"))
		f.Summary += whyNot(why)
	}
	return f
}

// nftNoEndpointCheck: kube-proxy nftables mode drops External-IPs in no-endpoint-services
// (kubernetes#131765).
type nftNoEndpointCheck struct{}

func (nftNoEndpointCheck) ID() string { return "nft-no-endpoint-drop" }
func (nftNoEndpointCheck) Title() string {
	return "kube-proxy nftables mode drops traffic to External-IPs in its no-endpoint-services map (kubernetes#131765)"
}

// noEndpointRE matches an element of kube-proxy's no-endpoint-services map:
// `ADDR . PROTO . PORT [comment "ns/svc:port"] : VERDICT`.
var noEndpointRE = regexp.MustCompile(`(\S+) \. (tcp|udp|sctp) \. (\d+)(?: comment "([^"]*)")? : (drop|goto [\w-]+|jump [\w-]+)`)

// NoEndpointDrops returns the elements of no-endpoint-services text with the drop verdict.
func NoEndpointDrops(text string) []string {
	var out []string
	for _, m := range noEndpointRE.FindAllStringSubmatch(text, -1) {
		if m[5] != "drop" {
			continue
		}
		s := m[1] + " " + m[2] + "/" + m[3]
		if m[4] != "" {
			s += " (" + m[4] + ")"
		}
		out = append(out, s)
	}
	return out
}

func (nftNoEndpointCheck) Run(ctx context.Context, env *Env) Finding {
	if f, other := otherMode(env, "nftables"); other {
		return f
	}
	if env.Kernel == nil {
		return cannot("%v", errNoKernel)
	}
	var drops, errs []string
	read := 0
	for _, fam := range []string{"ip", "ip6"} {
		out, err := env.Kernel.NftList(ctx, "map", fam, "kube-proxy", "no-endpoint-services")
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		read++
		drops = append(drops, NoEndpointDrops(out)...)
	}
	if read == 0 {
		return cannot("kube-proxy's no-endpoint-services map cannot be read: %s", strings.Join(errs, "; "))
	}
	f := Finding{ReportOnly: true, Evidence: []Evidence{ev("drop elements of no-endpoint-services", "%d", len(drops))},
		Remedy: "no fix of this agent (ipvs-externalip-dnat refuses nftables mode): kube-proxy 1.33+ (kubernetes#132456) lets this node's own traffic through; give the Service an endpoint here, or use externalTrafficPolicy: Cluster"}
	for i, d := range drops {
		if i == StaleExamples {
			f.Evidence = append(f.Evidence, ev("more", "%d", len(drops)-i))
			break
		}
		f.Evidence = append(f.Evidence, ev("element", "%s", d))
	}
	if len(drops) == 0 {
		f.State, f.Remedy, f.Summary = OK, "", "kube-proxy drops no External-IP for want of a local endpoint"
		return f
	}
	f.State = Problem
	f.Summary = fmt.Sprintf("kube-proxy drops %s of Services without a local endpoint (traffic from outside; this node's pods too before kubernetes#132456)", plural(len(drops), "External-IP port"))
	return f
}

// migrationCheck: what changes for this node when kube-proxy moves from iptables to nftables mode
// (seed 003's caveats).
type migrationCheck struct{}

func (migrationCheck) ID() string { return "nftables-migration" }
func (migrationCheck) Title() string {
	return "kube-proxy iptables mode → nftables mode: what this node relies on that nftables mode does not do"
}

// promValue sums the samples of metric name in Prometheus text.
func promValue(text, name string) (float64, bool) {
	total, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest != "" && rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
			found = true
		}
	}
	return total, found
}

func (migrationCheck) Run(ctx context.Context, env *Env) Finding {
	if f, other := otherMode(env, "iptables"); other {
		return f
	}
	f := Finding{ReportOnly: true, State: OK}
	var caveats, unknown []string
	// 1. NodePorts on localhost: nftables mode does not accept them (route_localnet).
	localhost, known := -1.0, false
	if env.KubeProxyMetrics != nil {
		if text, err := env.KubeProxyMetrics(ctx); err == nil {
			localhost, known = promValue(text, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total")
		} else {
			f.Evidence = append(f.Evidence, ev("kube-proxy metrics", "unreadable: %v", err))
		}
	}
	if known {
		f.Evidence = append(f.Evidence, ev("kubeproxy_iptables_localhost_nodeports_accepted_packets_total", "%.0f", localhost))
		if localhost > 0 {
			caveats = append(caveats, fmt.Sprintf("%.0f packets reached NodePorts on 127.0.0.1 (nftables mode does not serve localhost NodePorts)", localhost))
		}
	} else {
		f.Evidence = append(f.Evidence, ev("localhost NodePorts", "cannot tell: kube-proxy's metric kubeproxy_iptables_localhost_nodeports_accepted_packets_total not read"))
		unknown = append(unknown, "localhost NodePorts")
	}
	// 2. INVALID drops kube-proxy makes in iptables mode; nftables mode has its own (forward) drop,
	// and invalid-drop covers INPUT.
	found, packets, what := kubeProxyInvalidDrops(ctx, env)
	f.Evidence = append(f.Evidence, ev("kube-proxy INVALID drop", "%s", what))
	if found && packets > 0 && !env.Enabled(fixInvalidDrop) && !env.Enabled(fixLiberal) {
		caveats = append(caveats, fmt.Sprintf("kube-proxy dropped %d INVALID packets; keep invalid-drop enabled across the migration", packets))
	}
	// 3. NodePort traffic to addresses other than the primary one: nftables mode listens on the
	// primary addresses only (nodePortAddresses: primary).
	other, why := nodePortsOnOtherAddresses(ctx, env)
	if why != "" {
		f.Evidence = append(f.Evidence, ev("NodePorts on non-primary addresses", "cannot tell: %s", why))
		unknown = append(unknown, "NodePorts on non-primary addresses")
	} else {
		f.Evidence = append(f.Evidence, ev("NodePorts on non-primary addresses", "%d connections", len(other)))
		for i, o := range other {
			if i == StaleExamples {
				break
			}
			f.Evidence = append(f.Evidence, ev("connection", "%s", o))
		}
		if len(other) > 0 {
			caveats = append(caveats, fmt.Sprintf("%d connections reached a NodePort on an address other than the Node's primary ones (nftables mode serves NodePorts on the primary addresses only, unless nodePortAddresses says otherwise)", len(other)))
		}
	}
	if len(caveats) > 0 {
		f.State, f.Summary = Problem, strings.Join(caveats, "; ")
		f.Remedy = "before switching kube-proxy to nftables mode: stop using localhost NodePorts, set nodePortAddresses to the addresses in use, keep invalid-drop enabled"
		return f
	}
	if len(unknown) > 0 {
		f.State, f.Summary = CannotTell, "nothing seen that nftables mode would break, but not read: "+strings.Join(unknown, ", ")
		return f
	}
	f.Summary = "nothing seen that nftables mode would break"
	return f
}

// NodePortMin and NodePortMax are the default NodePort range (--service-node-port-range).
const (
	NodePortMin = 30000
	NodePortMax = 32767
)

// nodePortsOnOtherAddresses lists the DNATed connections (TCP, UDP) to a NodePort-range port on a
// local address that is not one of the Node's InternalIP/ExternalIP addresses.
func nodePortsOnOtherAddresses(ctx context.Context, env *Env) ([]string, string) {
	if env.Conntrack == nil || env.Kernel == nil {
		return nil, "conntrack is not readable here"
	}
	node := nodeTable(env)
	if node == nil {
		return nil, "the Node cannot be read: " + env.missing(nodeTableRef)
	}
	primary := map[netip.Addr]bool{}
	for _, a := range node.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			primary[ip.Unmap()] = true
		}
	}
	if len(primary) == 0 {
		return nil, "the Node has no addresses"
	}
	local, err := localAddrs()
	if err != nil {
		return nil, err.Error()
	}
	var out []string
	for _, fam := range rules.Families {
		for _, proto := range []rules.Protocol{rules.TCP, rules.UDP} {
			err := env.Conntrack.EachDNAT(ctx, fam, proto, func(e conntrackEntry) bool {
				d := e.Orig.Dst
				if d.Port() >= NodePortMin && d.Port() <= NodePortMax && local[d.Addr()] && !primary[d.Addr()] && !d.Addr().IsLoopback() {
					out = append(out, e.String())
				}
				return len(out) < 1000
			})
			if err != nil {
				return nil, err.Error()
			}
		}
	}
	return out, ""
}

type conntrackEntry = nodestate.ConntrackEntry

var nodeTableRef = inputs.Node

func nodeTable(env *Env) *corev1.Node {
	if env.missing(inputs.Node) != "" {
		return nil
	}
	return inputs.Node.Get(env.Cluster)
}

// localAddrs are the addresses of the namespace's interfaces.
func localAddrs() (map[netip.Addr]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list the local addresses: %w", err)
	}
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out, nil
}
