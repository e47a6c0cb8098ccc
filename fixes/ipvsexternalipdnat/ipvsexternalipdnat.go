package ipvsexternalipdnat

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Chain and map names (≤ 24 characters; the backends prefix them).
const (
	ChainPrerouting  = "EXTIP-PREROUTING"
	ChainOutput      = "EXTIP-OUTPUT"
	ChainDNAT        = "EXTIP-DNAT"
	ChainPostrouting = "EXTIP-POSTROUTING"
	MapName          = "svc"
)

// Skip reasons (metric-label safe).
const (
	ReasonHeadless     = "headless"
	ReasonExternalName = "external-name"
	ReasonNoClusterIP  = "no-cluster-ip"
	ReasonBadIP        = "bad-ip"
	ReasonIPModeProxy  = "ipmode-proxy"
	ReasonConflict     = fix.ReasonConflict
	ReasonNoPodCIDR    = "no-pod-cidr"
	ReasonBadPort      = "bad-port"
)

// Fix is the ipvs-externalip-dnat fix.
type Fix struct {
	fix.Base[Config, Config]
	m *fixMetrics

	entries *fix.ServiceMap[*guard]
	// clusterIPs keeps the Cluster-IPs outside the Service CIDRs, per family, sorted (see
	// clusterIPEntries).
	clusterIPs *fix.ServiceMap[*cidrSet]

	mu    sync.Mutex
	guard map[rules.Family]*guard   // the last guard per family: the same pointer while it decides alike, so Services need no recomputing
	cidrs map[rules.Family]*cidrSet // the last Service CIDRs per family, the same pointer while they stay
	// noCIDRsLogged: the absence of Service CIDRs was logged (once until some are known).
	noCIDRsLogged bool
}

var (
	_ fix.RuleFix  = (*Fix)(nil)
	_ fix.Checker  = (*Fix)(nil)
	_ fix.Observer = (*Fix)(nil)
)

// New builds the fix with its default configuration and registers its metrics.
func New(p fix.Params) (*Fix, error) {
	// The entries' budget is the backend's in use (an agent following kube-proxy may switch) at the
	// agent's memory limit: an iptables rule costs more memory than an nftables map element
	// (fix.MaxEntriesPerFixAt).
	budget := func() fix.Budget {
		if p.Backend == nil {
			return fix.DefaultBudget
		}
		return fix.BudgetFor(p.Backend.Name(), p.Limits.Memory)
	}
	f := &Fix{m: newMetrics(), entries: fix.NewServiceMap(serviceEntries).WithBudgetOf(budget),
		clusterIPs: fix.NewServiceMap(clusterIPEntries), guard: map[rules.Family]*guard{}, cidrs: map[rules.Family]*cidrSet{}}
	if err := f.Init(spec, p, f.m.collectors()...); err != nil {
		return nil, err
	}
	return f, nil
}

// Check refuses kube-proxy's iptables and nftables modes, which handle External-IP traffic
// themselves, and a node without kube-proxy, whose replacement does. The agent re-detects the mode
// on every resync, so the fix is refused (and its rules removed) as soon as the mode leaves IPVS.
func (f *Fix) Check(env fix.Env) error {
	switch env.ProxyMode {
	case "iptables", "nftables":
		return fmt.Errorf("%s: refusing to run in kube-proxy %s mode: kube-proxy itself handles External-IP traffic from the node in that mode, and this DNAT would bypass its chains (its service chains, endpoint selection and masquerading); the fix is for IPVS mode only", ID, env.ProxyMode)
	case fix.ProxyModeNone:
		return fmt.Errorf("%s: refusing to run without kube-proxy on this node: what replaces it handles External-IP traffic, and this DNAT would bypass it; the fix is for kube-proxy's IPVS mode only", ID)
	}
	return nil
}

// Configure applies options (fix.Base.Configure) and warns when they set the deprecated
// masqueradeMark, which no longer does anything.
func (f *Fix) Configure(options map[string]any) error {
	if err := f.Base.Configure(options); err != nil {
		return err
	}
	if m := f.Config().MasqueradeMark; m != 0 {
		f.Log.Warn(fmt.Sprintf("fixes.%s.masqueradeMark is deprecated and ignored: the fix no longer sets or reads a packet mark (it masquerades the connections it DNATed, found by conntrack); remove the key", ID), "masqueradeMark", fmt.Sprintf("0x%08x", m))
	}
	return nil
}

func validate(cfg Config) (Config, error) {
	if cfg.PodInterfacePrefix != "" {
		if err := rules.ValidInterfacePrefix(cfg.PodInterfacePrefix); err != nil {
			return cfg, fix.Invalid("podInterfacePrefix", "%v", err)
		}
	}
	if !cfg.FromPods && !cfg.FromHost {
		return cfg, fix.Invalid("", "fromPods and fromHost are both false, so the fix would do nothing (disable it with enabled: false instead)")
	}
	var err error
	if cfg.allowed, err = parseAllowed(cfg.AllowedCIDRs); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// precedes is what the hooked DNAT chains must stand ahead of: kube-proxy's KUBE-SERVICES, which in
// IPVS mode ACCEPTs traffic to its LoadBalancer and External-IP sets in nat PREROUTING and OUTPUT, so
// a DNAT behind it never runs. Other agents' jumps there (Calico's cali-PREROUTING, cali-OUTPUT:
// floating-IP DNAT only) may stand before ours.
var precedes = []string{"KUBE-SERVICES"}

// Rules maps every (External-IP, protocol, port) of this family to the Cluster-IP of the same family
// and hooks the lookup into prerouting (local pods) and output (host network).
func (f *Fix) Rules(snap *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report, error) {
	cfg := f.Config()

	m := f.entries.Update(inputs.Services.Get(snap), family, f.guardFor(cfg, snap, family))
	report := m.Report
	report.Skipped = slices.Clip(report.Skipped) // the node skip below must not write into the cached report
	rs := &rules.Ruleset{Fix: ID, Family: family, Maps: []rules.Map{{Name: MapName, Entries: m.Entries}}}

	jump := rules.Verdict{Kind: rules.Jump, Chain: ChainDNAT}
	if cfg.FromPods {
		c := rules.Chain{Name: ChainPrerouting, Type: rules.NAT, Hook: rules.Prerouting, Precedes: precedes}
		if cidrs := family.Prefixes(inputs.PodCIDRs.Get(snap)); len(cidrs) > 0 {
			c.Rules = append(c.Rules, rules.Rule{
				Match: rules.Match{SrcPrefixes: cidrs}, Verdict: jump,
				Comment: "from local pods",
			})
		}
		if cfg.PodInterfacePrefix != "" {
			c.Rules = append(c.Rules, rules.Rule{
				Match: rules.Match{InInterfacePrefix: cfg.PodInterfacePrefix}, Verdict: jump,
				Comment: "from pod interfaces",
			})
		}
		if len(c.Rules) == 0 {
			report.Skipped = append(report.Skipped, fix.Skip{
				Object: "node", Reason: ReasonNoPodCIDR,
				Detail: fmt.Sprintf("no %s pod CIDR and no podInterfacePrefix: traffic from pods is not caught, host traffic still is", family),
			})
		}
		rs.Chains = append(rs.Chains, c)
	}
	if cfg.FromHost {
		rs.Chains = append(rs.Chains, rules.Chain{Name: ChainOutput, Type: rules.NAT, Hook: rules.Output, Precedes: precedes, Rules: []rules.Rule{{
			Match: rules.Match{SrcAddrType: rules.Local}, Verdict: jump,
			Comment: "from the host network",
		}}})
	}
	rs.Chains = append(rs.Chains,
		rules.Chain{Name: ChainDNAT, Type: rules.NAT, Rules: []rules.Rule{
			{Match: rules.Match{Lookup: MapName}, Verdict: rules.Verdict{Kind: rules.DNATLookup}, Comment: "External-IP to Cluster-IP"},
		}},
		// What to masquerade is found by conntrack, not by a packet mark that any other component may
		// set or clear (Cilium's marks use bit 0x1000, issue #41): a connection this fix DNATed has
		// the DNAT status and, as its original destination, a key of the map. IPVS does not set the
		// status (it rewrites the conntrack reply itself), so traffic from outside the node to an
		// External-IP keeps its source.
		rules.Chain{Name: ChainPostrouting, Type: rules.NAT, Hook: rules.Postrouting, Rules: []rules.Rule{
			{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: MapName, LookupKey: rules.LookupCTOriginal}, Verdict: rules.Verdict{Kind: rules.Masquerade}, Comment: "masquerade what the fix DNATed"},
		}},
	)
	return rs, report, nil
}

// guardFor returns the guard for cfg and snap in family: the previous one while it decides alike, so
// that the per-Service results computed with it stay valid (fix.ServiceMap recomputes every Service
// when its input changes). A new Service changes it only when its Cluster-IP lies outside the known
// Service CIDRs.
func (f *Fix) guardFor(cfg Config, snap *fix.Snapshot, family rules.Family) *guard {
	f.mu.Lock()
	cidrs := f.cidrs[family]
	if cidrs == nil || !slices.Equal(cidrs.prefixes, inputs.ServiceCIDRs.Get(snap)) {
		cidrs = &cidrSet{prefixes: slices.Clone(inputs.ServiceCIDRs.Get(snap))}
		f.cidrs[family] = cidrs
	}
	f.mu.Unlock()
	g := newGuard(cfg, snap, f.clusterIPs.Update(inputs.Services.Get(snap), family, cidrs).Entries)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(inputs.ServiceCIDRs.Get(snap)) == 0 && !f.noCIDRsLogged {
		f.Log.Warn("no Service CIDRs known (no ServiceCIDR objects in the API, no serviceCIDRs configured): every Service's Cluster-IP is refused by name, and a Service with a new Cluster-IP makes every Service be computed again; set serviceCIDRs")
	}
	f.noCIDRsLogged = len(inputs.ServiceCIDRs.Get(snap)) == 0
	if prev := f.guard[family]; prev != nil && prev.same(&g) {
		return prev
	}
	f.guard[family] = &g
	return &g
}

// serviceEntries is the pure Service → map computation for one Service: an entry per External-IP
// and port. The core's fix.ServiceMap calls it only for Services that changed, and gives an entry
// that two Services want to the first in namespace/name order.
func serviceEntries(svc *fix.Service, family rules.Family, g *guard) ([]rules.MapEntry, []fix.Skip) {
	var skips []fix.Skip
	skip := func(reason, detail string) {
		skips = append(skips, fix.Skip{Reason: reason, Detail: detail})
	}
	ext := externalIPs(svc, family, g, skip)
	// A list the input did not hold (too long for any Service's budget): refused whole if the
	// Service has an external address, or had more than could be held.
	if sk, over := svc.OversizedSkip(); over && (len(ext) > 0 || slices.ContainsFunc(svc.Oversized, func(o fix.Oversized) bool { return o.Field != "spec.ports" })) {
		return nil, append(skips, sk)
	}
	if len(ext) == 0 {
		return nil, skips
	}
	switch {
	case svc.Type == fix.ServiceTypeExternalName:
		skip(ReasonExternalName, "an ExternalName Service has no Cluster-IP to DNAT to")
		return nil, skips
	case svc.Headless:
		skip(ReasonHeadless, "a headless Service has no Cluster-IP to DNAT to")
		return nil, skips
	}
	clusterIP, ok := clusterIPOf(svc, family, skip)
	if !ok {
		return nil, skips
	}
	// Addresses × ports can be millions in one Service the API accepts: refuse it before making them.
	if sk, over := fix.OverServiceBudget(len(ext) * countPorts(svc)); over {
		return nil, append(skips, sk)
	}
	name := svc.Key()
	var entries []rules.MapEntry
	for _, p := range svc.Ports {
		proto := rules.TCP
		if p.Protocol != "" {
			var err error
			if proto, err = rules.ParseProtocol(string(p.Protocol)); err != nil {
				skip(ReasonBadPort, fmt.Sprintf("port %s: %v", portName(p), err))
				continue
			}
		}
		if p.Port <= 0 || p.Port > 65535 {
			skip(ReasonBadPort, fmt.Sprintf("port %s: %d is not a port number", portName(p), p.Port))
			continue
		}
		for _, ip := range ext {
			entries = append(entries, rules.MapEntry{
				Addr: ip, Protocol: proto, Port: uint16(p.Port),
				To:      netip.AddrPortFrom(clusterIP, uint16(p.Port)),
				Comment: comment(name, p),
			})
		}
	}
	return entries, skips
}

// externalIPs returns the Service's external addresses of family, in order and without duplicates:
// the ingress IPs of a LoadBalancer Service (not those with ipMode Proxy, which must go through the
// load balancer) and spec.externalIPs, less those g refuses. Bad, refused and ipMode-Proxy addresses
// are reported through skip, each once and in the family it looks like.
func externalIPs(svc *fix.Service, family rules.Family, g *guard, skip func(reason, detail string)) []netip.Addr {
	var out []netip.Addr
	proxied := map[netip.Addr]bool{}
	refused := map[netip.Addr]bool{}
	invalid := func(prefix string) {
		for _, bad := range svc.Invalid {
			if strings.HasPrefix(bad.Field, prefix) && looksLike(bad.Value) == family {
				skip(ReasonBadIP, fmt.Sprintf("%s %q is not an IP address", bad.Field, bad.Value))
			}
		}
	}
	// check returns raw unmapped, and whether it is of family and g lets it through; field names
	// it in a skip (formatted only then: this runs for every address of every Service).
	check := func(field func() string, raw netip.Addr) (netip.Addr, bool) {
		a := raw.Unmap()
		if !family.Contains(a) {
			return a, false
		}
		if reason, detail := g.check(raw); reason != "" {
			if !refused[raw] {
				skip(reason, field()+": "+detail)
			}
			refused[raw] = true
			return a, false
		}
		return a, true
	}
	if svc.Type == fix.ServiceTypeLoadBalancer {
		invalid("status.loadBalancer.ingress")
		for i, ing := range svc.Ingress {
			a, ok := check(func() string { return fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i) }, ing.IP)
			if !ok {
				continue
			}
			if ing.Proxy {
				if !proxied[a] {
					skip(ReasonIPModeProxy, fmt.Sprintf("%s has ipMode Proxy: traffic must go through the load balancer", a))
				}
				proxied[a] = true
				continue
			}
			out = append(out, a)
		}
	}
	invalid("spec.externalIPs")
	for i, raw := range svc.ExternalIPs {
		a, ok := check(func() string { return fmt.Sprintf("spec.externalIPs[%d]", i) }, raw)
		switch {
		case !ok:
		case !g.spec:
			if !refused[a] && !slices.Contains(out, a) {
				skip(ReasonSpecExternalIP, fmt.Sprintf("spec.externalIPs[%d] %s: spec.externalIPs are taken over only with fixes.%s.specExternalIPs: true (anyone who may create a Service sets them, CVE-2020-8554)", i, a, ID))
			}
			refused[a] = true
		default:
			out = append(out, a)
		}
	}
	// Drop duplicates (an address both in the ingress and in externalIPs) and proxied addresses.
	var uniq []netip.Addr
	for _, a := range out {
		if !proxied[a] && !slices.Contains(uniq, a) {
			uniq = append(uniq, a)
		}
	}
	return uniq
}

// looksLike guesses the family of an unparsable address so it is reported once, not per family.
func looksLike(s string) rules.Family {
	if strings.Contains(s, ":") {
		return rules.IPv6
	}
	return rules.IPv4
}

// clusterIPOf returns the Service's Cluster-IP of family (spec.clusterIPs, else spec.clusterIP).
func clusterIPOf(svc *fix.Service, family rules.Family, skip func(reason, detail string)) (netip.Addr, bool) {
	for _, bad := range svc.Invalid {
		if strings.HasPrefix(bad.Field, "spec.clusterIPs") && looksLike(bad.Value) == family {
			skip(ReasonBadIP, fmt.Sprintf("%s %q is not an IP address", bad.Field, bad.Value))
			return netip.Addr{}, false
		}
	}
	for _, a := range svc.ClusterIPs {
		if a = a.Unmap(); family.Contains(a) {
			return a, true
		}
	}
	skip(ReasonNoClusterIP, fmt.Sprintf("the Service has %s External-IPs but no %s Cluster-IP", family, family))
	return netip.Addr{}, false
}

// countPorts is how many ports of svc get entries (serviceEntries' checks, without their skips).
func countPorts(svc *fix.Service) int {
	n := 0
	for _, p := range svc.Ports {
		if _, err := rules.ParseProtocol(string(p.Protocol)); (p.Protocol == "" || err == nil) && p.Port > 0 && p.Port <= 65535 {
			n++
		}
	}
	return n
}

func portName(p fix.ServicePort) string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Port))
}

// comment is "<ns>/<name>:<port>", cut to the kernel's 128 bytes. Backends say which fix it is
// (iptables prefixes the fix id; in nftables the table is the fix's own).
func comment(name string, p fix.ServicePort) string {
	c := name + ":" + portName(p)
	if len(c) > 128 {
		c = c[:128]
	}
	return c
}

// Observe exports the figures of the last Rules call of family.
func (f *Fix) Observe(_ context.Context, family rules.Family, report fix.Report) {
	skipped := map[string]bool{}
	for _, s := range report.Skipped {
		if s.Object != "node" {
			skipped[s.Object] = true
		}
	}
	fam := string(family)
	f.m.services.WithLabelValues(fam, "covered").Set(float64(report.Covered))
	f.m.services.WithLabelValues(fam, "skipped").Set(float64(len(skipped)))
	f.m.ips.WithLabelValues(fam).Set(float64(report.Items))
}
