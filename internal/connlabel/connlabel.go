// Package connlabel gives each map that a fix both DNATs by and finds again by the connection's
// original destination (rules.LookupCTOriginal) a bit of the conntrack labels, so that both
// backends find the connections a map translated with one match whatever the map's size: every
// rule that DNATs by the map sets the bit, and the lookup by original destination matches it.
//
// Why a label and not a lookup by original destination: iptables can only walk rules (a tree of
// -m conntrack --ctorigdst rules, each an xt match), and nftables' lookup of the original
// destination is one more hash lookup, with its cache misses, for every DNATed connection
// (bench/datapath; the datapath section of BENCHMARKS.md). Why not a packet mark: a mark is shared
// with every other component (Cilium's and Calico's marks, kube-proxy's 0x4000; issue #41), while
// the 128 label bits are used by little on a Kubernetes node (Open vSwitch labels connections of
// its own conntrack zones). The agent takes bits from First up. The kernel gives connections
// labels only while a rule that uses them is loaded (nf_connlabels_get): then every new connection
// carries the 16 bytes of its labels (nf_ct_labels_ext_add), whether a rule sets a bit or not.
package connlabel

import (
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

const (
	// First is the lowest label bit the agent takes.
	First = 64
	// End is one past the highest: the kernel has 128 label bits (XT_CONNLABEL_MAXBIT + 1).
	End = 128
)

// book holds the bits given to (fix, map) pairs in this process. A pair takes the bit its name
// hashes to, or the next free one: the same pairs get the same bits on every start unless two of
// them hash alike, and then only the order in which they are first rendered decides. A bit that
// changes across restarts costs nothing: NAT is decided on a connection's first packet, so a
// connection the old bit labelled has its masquerade already.
var book = NewBook()

// Book gives label bits to (fix, map) pairs.
type Book struct {
	mu    sync.Mutex
	bit   map[string]int
	owner [End - First]string
}

// NewBook is an empty Book (the process has one, used by Of; tests make their own).
func NewBook() *Book { return &Book{bit: map[string]int{}} }

// Bit is the label bit of map m of fix: the same on every call.
func (b *Book) Bit(fix, m string) (int, error) {
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
			b.bit[key] = First + j
			return First + j, nil
		}
	}
	return 0, fmt.Errorf("map %s: no conntrack label left for its lookup by original destination (%d maps of this agent's fixes have one)", key, n)
}

// Bit is the process's label bit of map m of fix.
func Bit(fix, m string) (int, error) { return book.Bit(fix, m) }

// Of is the label that rule r of rs matches (a lookup by original destination) or sets (a DNAT by
// a map that such a lookup reads), or 0.
func Of(rs *rules.Ruleset, r rules.Rule) (int, error) {
	m := r.Match
	switch {
	case m.Lookup == "":
		return 0, nil
	case m.LookupKey == rules.LookupCTOriginal:
	case r.Verdict.Kind == rules.DNATLookup && rs.FindsOriginal(m.Lookup):
	default:
		return 0, nil
	}
	return Bit(rs.Fix, m.Lookup)
}
