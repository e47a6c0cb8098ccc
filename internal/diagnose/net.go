package diagnose

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// linkRoutes is what the network checks share: the links, the routes, which links face the pods
// and which carry the default route.
type linkRoutes struct {
	links    map[string]Link
	routes   []Route
	pod      []string // links with a route into this node's pod CIDRs (or podInterfacePrefix)
	uplink   []string // links of the default routes
	carriers []string // up links with any route, lo excluded
}

func readLinkRoutes(env *Env) (*linkRoutes, error) {
	if env.Kernel == nil {
		return nil, errNoKernel
	}
	links, err := env.Kernel.Links()
	if err != nil {
		return nil, fmt.Errorf("list the links: %w", err)
	}
	routes, err := env.Kernel.Routes()
	if err != nil {
		return nil, fmt.Errorf("read the routes: %w", err)
	}
	lr := &linkRoutes{links: map[string]Link{}, routes: routes}
	for _, l := range links {
		lr.links[l.Name] = l
	}
	prefix, _ := env.Options[fixMSSClamp]["podInterfacePrefix"].(string)
	add := func(list *[]string, dev string) {
		if l, ok := lr.links[dev]; ok && l.Up && dev != "lo" && !slices.Contains(*list, dev) {
			*list = append(*list, dev)
		}
	}
	for _, r := range routes {
		add(&lr.carriers, r.Dev)
		if r.Dst.Bits() == 0 {
			add(&lr.uplink, r.Dev)
		}
		for _, p := range env.PodCIDRs {
			if p.Overlaps(r.Dst) && r.Dst.Bits() > 0 {
				add(&lr.pod, r.Dev)
			}
		}
	}
	if prefix != "" {
		for name := range lr.links {
			if strings.HasPrefix(name, prefix) {
				add(&lr.pod, name)
			}
		}
	}
	for _, l := range [][]string{lr.carriers, lr.uplink, lr.pod} {
		sort.Strings(l)
	}
	return lr, nil
}

func (lr *linkRoutes) mtus(names []string) string {
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s mtu %d", n, lr.links[n].MTU))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// pathMTU is the MTU of route r: its own mtu attribute, else its link's.
func (lr *linkRoutes) pathMTU(r Route) int {
	if r.MTU > 0 {
		return r.MTU
	}
	return lr.links[r.Dev].MTU
}

// describe is "dev mtu N" for a route without an mtu attribute, "DST dev mtu N (route)" for one.
func (lr *linkRoutes) describe(r Route) string {
	if r.MTU > 0 {
		dst := r.Dst.String()
		if r.Dst.Bits() == 0 {
			dst = "default"
		}
		return fmt.Sprintf("%s dev %s mtu %d (route; link %d)", dst, r.Dev, r.MTU, lr.links[r.Dev].MTU)
	}
	return fmt.Sprintf("%s mtu %d", r.Dev, lr.links[r.Dev].MTU)
}

// narrower returns the routes (not into the pod CIDRs, through an up link other than a pod link)
// whose path MTU is below mtu, described once each, and the smallest MSS any of them carries (the
// path MTU less the IPv4 or IPv6 and TCP headers).
func (lr *linkRoutes) narrower(mtu int) (desc []string, minMSS int) {
	for _, r := range lr.routes {
		if slices.Contains(lr.pod, r.Dev) || !slices.Contains(lr.carriers, r.Dev) {
			continue
		}
		p := lr.pathMTU(r)
		if p >= mtu {
			continue
		}
		if d := lr.describe(r); !slices.Contains(desc, d) {
			desc = append(desc, d)
		}
		if m := p - tcpHeaders(r.Family); minMSS == 0 || m < minMSS {
			minMSS = m
		}
	}
	sort.Strings(desc)
	return desc, minMSS
}

// tcpHeaders is what an IP and a TCP header take of a packet: the MSS is the MTU less this.
func tcpHeaders(f rules.Family) int {
	if f == rules.IPv6 {
		return 60
	}
	return 40
}

// pmtuCheck: pod traffic leaves through a route narrower than the pods' links (mss-clamp).
type pmtuCheck struct{}

func (pmtuCheck) ID() string { return "pmtu" }
func (pmtuCheck) Title() string {
	return "pod TCP crosses a route narrower than the pods' MTU and no MSS clamp makes the handshake fit (large transfers hang when ICMP is filtered)"
}

func (pmtuCheck) Run(ctx context.Context, env *Env) Finding {
	lr, err := readLinkRoutes(env)
	if err != nil {
		return cannot("%v", err)
	}
	if len(lr.pod) == 0 {
		why := env.PodCIDRsWhy
		if len(env.PodCIDRs) > 0 {
			why = "no route into the pod CIDRs " + addrList(env.PodCIDRs, 4) + " leaves by an interface that is up"
		}
		return cannot("the interfaces that carry pod traffic are unknown: %s (or set fixes.mss-clamp.podInterfacePrefix)", why)
	}
	podMTU := 0
	for _, n := range lr.pod {
		podMTU = max(podMTU, lr.links[n].MTU)
	}
	narrow, minMSS := lr.narrower(podMTU)
	var defaults []string
	for _, r := range lr.routes {
		if r.Dst.Bits() == 0 && slices.Contains(lr.uplink, r.Dev) {
			defaults = append(defaults, lr.describe(r))
		}
	}
	sort.Strings(defaults)
	f := Finding{Remedy: "enable mss-clamp (fixes.mss-clamp.enabled: true) without a fixed mss: the clamp follows the route's MTU",
		Evidence: []Evidence{
			ev("pod interfaces", "%s", lr.mtus(lr.pod)),
			ev("default route", "%s", orNone(slices.Compact(defaults))),
			ev("narrower routes", "%s", orNone(narrow)),
		}}
	if len(narrow) == 0 {
		f.State, f.Remedy = OK, ""
		f.Summary = fmt.Sprintf("no route is narrower than the pods' MTU %d", podMTU)
		return f
	}
	clamp, why, evs := env.inForce(ctx, fixMSSClamp, ruleCounters(fixMSSClamp))
	f.Evidence = append(f.Evidence, evs...)
	if clamp {
		if mss := optionInt(env, fixMSSClamp, "mss"); mss > minMSS {
			clamp, why = false, fmt.Sprintf("mss-clamp clamps to a fixed mss %d, above the %d the narrowest route carries", mss, minMSS)
		}
	}
	notInForce(&f, why)
	if clamp {
		f.State, f.HandledBy = Handled, fixMSSClamp
		f.Summary = fmt.Sprintf("mss-clamp clamps pod SYNs to what the route carries (pods %d; %s)", podMTU, strings.Join(narrow, ", "))
		return f
	}
	f.State = Problem
	f.Summary = fmt.Sprintf("pods send segments sized for MTU %d, routes leave through %s: where ICMP \"fragmentation needed\" is filtered, large transfers hang", podMTU, strings.Join(narrow, ", "))
	f.Summary += whyNot(why)
	return f
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}

// optionInt reads an integer option of a fix as configured (a file's number, an environment's
// string); 0 when it is unset or not a number.
func optionInt(env *Env, fix, key string) int {
	for k, v := range env.Options[fix] {
		if strings.EqualFold(k, key) {
			return atoi(fmt.Sprint(v))
		}
	}
	return 0
}

// NeighbourFillLimit is the share of gc_thresh3 above which the neighbour table is reported.
const NeighbourFillLimit = 0.8

// neighbourCheck: the neighbour table near gc_thresh3 (report-only).
type neighbourCheck struct{}

func (neighbourCheck) ID() string { return "neighbour-table" }
func (neighbourCheck) Title() string {
	return "the neighbour (ARP/NDP) table is near gc_thresh3: new neighbours fail (\"neighbour table overflow\")"
}

func (neighbourCheck) Run(_ context.Context, env *Env) Finding {
	if env.Kernel == nil || env.Sysctl == nil {
		return cannot("%v", errNoKernel)
	}
	counts, err := env.Kernel.Neighbours()
	if err != nil {
		return cannot("%v", err)
	}
	f := Finding{ReportOnly: true, State: OK,
		Remedy: "no fix: raise net.ipv4.neigh.default.gc_thresh3 (and gc_thresh1/2; ipv6 too) above the number of neighbours"}
	var full []string
	read := 0
	for _, fam := range rules.Families {
		name := "net." + procSysFamily(fam) + ".neigh.default.gc_thresh3"
		v, err := env.Sysctl.Get(name)
		t, perr := strconv.Atoi(v)
		if err != nil || perr != nil || t <= 0 {
			f.Evidence = append(f.Evidence, ev(string(fam), "%d neighbours, %s unreadable", counts[fam], name))
			continue
		}
		read++
		f.Evidence = append(f.Evidence, ev(string(fam), "%d neighbours of gc_thresh3 %d (%.0f%%)", counts[fam], t, 100*float64(counts[fam])/float64(t)))
		if float64(counts[fam]) >= NeighbourFillLimit*float64(t) {
			full = append(full, fmt.Sprintf("%s: %d of %d", fam, counts[fam], t))
		}
	}
	if read == 0 {
		return Finding{State: CannotTell, Evidence: f.Evidence, Summary: "gc_thresh3 cannot be read (the neigh.default sysctls exist only in the node's initial network namespace)"}
	}
	if len(full) > 0 {
		f.State, f.Summary = Problem, "the neighbour table is near gc_thresh3 ("+strings.Join(full, "; ")+")"
		return f
	}
	f.Summary, f.Remedy = fmt.Sprintf("below %.0f%% of gc_thresh3", 100*NeighbourFillLimit), ""
	return f
}

// rpFilterCheck: strict reverse-path filtering on interfaces that carry pod traffic (report-only).
type rpFilterCheck struct{}

func (rpFilterCheck) ID() string { return "rp-filter" }
func (rpFilterCheck) Title() string {
	return "strict rp_filter on an interface that carries pod traffic drops packets of asymmetric paths (kubernetes#124587)"
}

func (rpFilterCheck) Run(_ context.Context, env *Env) Finding {
	lr, err := readLinkRoutes(env)
	if err != nil {
		return cannot("%v", err)
	}
	ifs := slices.Clone(lr.pod)
	for _, u := range lr.uplink {
		if !slices.Contains(ifs, u) {
			ifs = append(ifs, u)
		}
	}
	sort.Strings(ifs)
	if len(ifs) == 0 {
		return cannot("no interface carries a default route or a route into the pod CIDRs (%s)", env.PodCIDRsWhy)
	}
	all, err := env.Kernel.InterfaceSysctl(rules.IPv4, "all", "rp_filter")
	if err != nil {
		return cannot("net.ipv4.conf.all.rp_filter: %v", err)
	}
	f := Finding{ReportOnly: true, Evidence: []Evidence{ev("net.ipv4.conf.all.rp_filter", "%s", all)},
		Remedy: "no fix: set rp_filter=2 (loose) on these interfaces, as Cilium and the AWS VPC CNI do (never 0 globally)"}
	var strict []string
	for _, dev := range ifs {
		v, err := env.Kernel.InterfaceSysctl(rules.IPv4, dev, "rp_filter")
		if err != nil {
			f.Evidence = append(f.Evidence, ev(dev, "unreadable: %v", err))
			continue
		}
		// The kernel uses the larger of conf/all and conf/<dev>.
		eff := max(atoi(all), atoi(v))
		f.Evidence = append(f.Evidence, ev("net.ipv4.conf."+dev+".rp_filter", "%s (effective %d)", v, eff))
		if eff == 1 {
			strict = append(strict, dev)
		}
	}
	if len(strict) > 0 {
		f.State, f.Summary = Problem, "strict reverse-path filtering (rp_filter=1) on "+strings.Join(strict, ", ")
		return f
	}
	f.State, f.Summary, f.Remedy = OK, "no strict rp_filter on "+strings.Join(ifs, ", "), ""
	return f
}

func atoi(s string) int { n, _ := strconv.Atoi(strings.TrimSpace(s)); return n }

var _ = netip.Prefix{}
