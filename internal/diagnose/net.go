package diagnose

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/neighbourtable"
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

// neighbourCheck: the neighbour table near gc_thresh3, or neighbours refused (neighbour-table).
type neighbourCheck struct{}

func (neighbourCheck) ID() string { return "neighbour-table" }
func (neighbourCheck) Title() string {
	return "the neighbour (ARP/NDP) table is near gc_thresh3 or full: new neighbours fail (\"neighbour table overflow\", kops#4533)"
}

func (neighbourCheck) Run(ctx context.Context, env *Env) Finding {
	if env.Kernel == nil || env.Sysctl == nil {
		return cannot("%v", errNoKernel)
	}
	f := Finding{State: OK, Remedy: "enable neighbour-table (fixes.neighbour-table.enabled: true), or raise net.ipv{4,6}.neigh.default.gc_thresh1/2/3 above the number of neighbours"}
	f.counters = map[string]uint64{}
	var full []string
	obs := map[rules.Family]neighbourtable.Observation{}
	read := 0
	scope := "every namespace"
	var here map[rules.Family]int // this namespace's, where the global count is not shown
	for _, fam := range rules.Families {
		entries, fulls, err := env.Kernel.NeighbourStats(fam)
		if errors.Is(err, os.ErrNotExist) {
			if here == nil {
				if here, err = env.Kernel.Neighbours(); err != nil {
					return cannot("%v", err)
				}
			}
			entries, scope = here[fam], "this namespace only: the global count is in the initial one"
		} else if err != nil {
			f.Evidence = append(f.Evidence, ev(string(fam), "unreadable: %v", err))
			continue
		}
		o := neighbourtable.Observation{Entries: entries}
		ok := true
		for i := range o.Thresh {
			v, err := env.Sysctl.Get(neighbourtable.Thresh(fam, i+1))
			if o.Thresh[i] = atoi(v); err != nil || o.Thresh[i] <= 0 {
				ok = false
			}
		}
		if !ok {
			f.Evidence = append(f.Evidence, ev(string(fam), "%d entries, %s unreadable", entries, neighbourtable.Thresh(fam, 3)))
			continue
		}
		read++
		t3 := o.Thresh[2]
		f.counters[string(fam)+" table_fulls"] = fulls
		f.Evidence = append(f.Evidence, ev(string(fam), "%d entries (%s) of gc_thresh3 %d (%.0f%%); gc_thresh1/2 %d/%d; table_fulls %d",
			entries, scope, t3, 100*float64(entries)/float64(t3), o.Thresh[0], o.Thresh[1], fulls))
		if float64(entries) >= NeighbourFillLimit*float64(t3) {
			full = append(full, fmt.Sprintf("%s: %d of %d", fam, entries, t3))
		}
		if fulls > 0 {
			if d := risen(env, "neighbour-table", string(fam)+" table_fulls", fulls, &f); d > 0 {
				full = append(full, fmt.Sprintf("%s: %d neighbours refused (table_fulls)", fam, d))
				if env.Previous != nil {
					o.Fulls = d
				}
			}
		}
		obs[fam] = o
	}
	if read == 0 {
		return Finding{State: CannotTell, Evidence: f.Evidence, Summary: "gc_thresh3 cannot be read (the neigh.default sysctls exist only in the node's initial network namespace)"}
	}
	if len(full) == 0 {
		f.Summary, f.Remedy = fmt.Sprintf("below %.0f%% of gc_thresh3, no neighbour refused", 100*NeighbourFillLimit), ""
		return f
	}
	// neighbour-table handles it while in force and each family holds the thresholds it asks for now.
	raise, why, evs := env.inForce(ctx, fixNeighbours, func(_ context.Context, env *Env) (bool, string) {
		opts, err := neighbourtable.Options(env.Options[fixNeighbours])
		if err != nil {
			return false, "its options do not parse: " + err.Error()
		}
		var held []string
		for _, fam := range rules.Families {
			o, ok := obs[fam]
			if !ok {
				continue
			}
			d := neighbourtable.Desired(o, opts)
			switch {
			case d.Limited && d.Thresh[2] <= o.Thresh[2]:
				return false, fmt.Sprintf("%s gc_thresh3 %d is at maxThresh3 %d", fam, o.Thresh[2], opts.MaxThresh3)
			case d.Thresh != o.Thresh:
				return false, fmt.Sprintf("%s gc_thresh3 is %d; the fix raises it to %d on its next pass (%s)", fam, o.Thresh[2], d.Thresh[2], d.Why)
			}
			held = append(held, fmt.Sprintf("%s gc_thresh3 %d", fam, o.Thresh[2]))
		}
		return true, strings.Join(held, ", ")
	})
	f.Evidence = append(f.Evidence, evs...)
	notInForce(&f, why)
	if raise {
		f.State, f.HandledBy = Handled, fixNeighbours
		f.Summary = "the neighbour table is near gc_thresh3 or was full (" + strings.Join(full, "; ") + "); neighbour-table raises the thresholds"
		return f
	}
	f.State, f.Summary = Problem, "the neighbour table is near gc_thresh3 or was full ("+strings.Join(full, "; ")+")"+whyNot(why)
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
