package diagnose

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/staleudpconntrack"
)

// StaleExamples is how many stale entries a finding shows.
const StaleExamples = 5

// staleUDPCheck: UDP entries DNATed to a pod address of this node that no Pod holds now.
type staleUDPCheck struct{}

func (staleUDPCheck) ID() string { return "stale-udp" }
func (staleUDPCheck) Title() string {
	return "UDP conntrack entries still DNAT a client's packets to a pod address of this node that no Pod holds (kubernetes#58336)"
}

// StaleUDP counts the UDP entries destination-NATed into cidrs to an address that no live Pod of
// pods holds, with up to StaleExamples of them: stale-udp-conntrack's judge (its LiveAddrs and
// DNATTarget) on a one-off reading, without the history of addresses the fix keeps.
func StaleUDP(ctx context.Context, ct nodestate.Conntrack, live map[netip.Addr]bool, cidrs []netip.Prefix) (int, []nodestate.ConntrackEntry, error) {
	n := 0
	var examples []nodestate.ConntrackEntry
	for _, fam := range rules.Families {
		in := fam.Prefixes(cidrs)
		if len(in) == 0 {
			continue
		}
		err := ct.EachDNAT(ctx, fam, rules.UDP, func(e nodestate.ConntrackEntry) bool {
			t, ok := staleudpconntrack.DNATTarget(e)
			if !ok || live[t] || !contains(in, t) {
				return true
			}
			n++
			if len(examples) < StaleExamples {
				examples = append(examples, e)
			}
			return true
		})
		if err != nil {
			return n, examples, err
		}
	}
	return n, examples, nil
}

func contains(list []netip.Prefix, a netip.Addr) bool {
	for _, p := range list {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (staleUDPCheck) Run(ctx context.Context, env *Env) Finding {
	if env.Conntrack == nil {
		return cannot("the conntrack table is not readable here")
	}
	if len(env.PodCIDRs) == 0 {
		return cannot("this node's pod CIDRs are unknown: %s", env.PodCIDRsWhy)
	}
	// stale-udp-conntrack's work (deletions) leaves nothing to read: its last sync is the proof.
	fixOn, whyOff, evs := env.inForce(ctx, fixStaleUDP, nil)
	if why := env.missing(inputs.Pods); why != "" {
		if fixOn {
			return Finding{State: Handled, HandledBy: fixStaleUDP, Evidence: evs, Summary: "stale-udp-conntrack deletes the entries of the pod addresses it sees go (this node's Pods were not read: " + why + ")"}
		}
		f := cannot("this node's Pods cannot be read: %s", why)
		notInForce(&f, whyOff)
		return f
	}
	live := staleudpconntrack.LiveAddrs(inputs.Pods.Get(env.Cluster))
	n, examples, err := StaleUDP(ctx, env.Conntrack, live, env.PodCIDRs)
	if err != nil {
		return cannot("dump the UDP conntrack entries: %v", err)
	}
	f := Finding{Remedy: "enable stale-udp-conntrack (fixes.stale-udp-conntrack.enabled: true; it needs get/list/watch on Pods), or `conntrack -D -p udp --reply-src ADDRESS` once",
		Evidence: []Evidence{
			ev("pod CIDRs", "%s", addrList(env.PodCIDRs, 4)),
			ev("pod addresses held by this node's Pods", "%d", len(live)),
			ev("stale UDP entries", "%d", n),
		}}
	for _, e := range examples {
		f.Evidence = append(f.Evidence, ev("example", "%s", e))
	}
	f.Evidence = append(f.Evidence, evs...)
	notInForce(&f, whyOff)
	switch {
	case n == 0:
		f.State, f.Remedy = OK, ""
		f.Summary = "no UDP entry is DNATed to a pod address of this node that no Pod holds"
	case fixOn:
		f.State, f.HandledBy = Handled, fixStaleUDP
		f.Summary = fmt.Sprintf("%d UDP entries point to no Pod; stale-udp-conntrack deletes those whose Pod it saw go (within its retention)", n)
	default:
		f.State = Problem
		f.Summary = fmt.Sprintf("%d UDP entries DNAT to a pod address of this node that no Pod holds: their clients' packets go nowhere", n)
		f.Summary += whyNot(whyOff)
	}
	return f
}
