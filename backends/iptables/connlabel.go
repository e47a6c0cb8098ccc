package iptables

import (
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/connlabel"
)

// Conntrack labels: how the iptables backend finds, in postrouting, the connections a map's DNAT
// translated (rules.LookupCTOriginal) with one rule whatever the map's size (internal/connlabel
// gives each map its bit). iptables can only walk rules: matching the connection's original
// destination against the map's entries took a tree of -m conntrack --ctorigdst rules, each an xt
// match, walked by every masqueraded connection. Instead (with the dispatch rules' comments gone
// too) a DNATed connection at 10,000 scattered entries pays +5.1-5.7 µs over the floor instead of
// +12.4-13.9 (bench/datapath, medians of three runs; the datapath section of BENCHMARKS.md). Each
// rule that DNATs by the map also sets the map's bit (-m connlabel --set, run only by the packets
// the rule's native matches took), and the lookup by original destination is one rule that
// matches the label, then the rule's conntrack status (a connection without the label meets one
// xt match, as it met the tree's guard).

// labelOf is the label that rule r of rs matches or sets, or 0 (connlabel.Of).
func labelOf(rs *rules.Ruleset, r rules.Rule) (int, error) { return connlabel.Of(rs, r) }
