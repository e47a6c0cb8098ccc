package iptables

import (
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Conntrack labels: how the iptables backend finds, in postrouting, the connections a map's DNAT
// translated (rules.LookupCTOriginal) with one rule whatever the map's size. iptables can only walk
// rules: matching the connection's original destination against the map's entries took a tree of
// -m conntrack --ctorigdst rules, each an xt match, walked by every masqueraded connection. Instead
// (with the dispatch rules' comments gone too) a DNATed connection at 10,000 scattered entries pays
// +5.1-5.7 µs over the floor instead of +12.4-13.9 (bench/datapath, medians of three runs; the
// datapath section of BENCHMARKS.md). Each rule that DNATs by
// the map also sets a bit of the connection's conntrack labels (-m connlabel --set, run only by the
// packets the rule's native matches took), and the lookup by original destination is one rule that
// matches the label, then the rule's conntrack status (a connection without the label meets one xt
// match, as it met the tree's guard). A packet mark would do the same but is shared with every other component
// (Cilium's and Calico's marks, kube-proxy's 0x4000; issue #41); the 128 label bits are used by
// little on a Kubernetes node (Open vSwitch labels connections of its own conntrack zones), and the
// agent takes bits from labelFirst up. The kernel gives a connection labels only while a rule that
// uses them is loaded (nf_connlabels_get), at no cost to other connections.
const (
	labelFirst = 64
	labelEnd   = 128 // the kernel's 128 label bits (XT_CONNLABEL_MAXBIT + 1)
)

// labels are the bits given to (fix, map) pairs in this process. A pair takes the bit its name
// hashes to, or the next free one: the same pairs get the same bits on every start unless two of
// them hash alike, and then only the order in which they are first rendered decides. A bit that
// changes across restarts costs nothing: NAT is decided on a connection's first packet, so a
// connection the old bit labelled has its masquerade already.
var labels = labelBook{bit: map[string]int{}}

type labelBook struct {
	mu    sync.Mutex
	bit   map[string]int
	owner [labelEnd - labelFirst]string
}

// of is the label bit of map m of fix.
func (b *labelBook) of(fix, m string) (int, error) {
	key := fix + "/" + m
	b.mu.Lock()
	defer b.mu.Unlock()
	if bit, ok := b.bit[key]; ok {
		return bit, nil
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	n := len(b.owner)
	start := int(h.Sum32() % uint32(n))
	for i := range n {
		j := (start + i) % n
		if b.owner[j] == "" {
			b.owner[j] = key
			b.bit[key] = labelFirst + j
			return labelFirst + j, nil
		}
	}
	return 0, fmt.Errorf("map %s: no conntrack label left for its lookup by original destination (%d maps of this agent's fixes have one)", key, n)
}

// labelOf is the label that rule r of rs matches (a lookup by original destination) or sets (a DNAT
// by a map that such a lookup reads), or 0.
func labelOf(rs *rules.Ruleset, r rules.Rule) (int, error) {
	m := r.Match
	switch {
	case m.Lookup == "":
		return 0, nil
	case m.LookupKey == rules.LookupCTOriginal:
	case r.Verdict.Kind == rules.DNATLookup && rs.FindsOriginal(m.Lookup):
	default:
		return 0, nil
	}
	return labels.of(rs.Fix, m.Lookup)
}
