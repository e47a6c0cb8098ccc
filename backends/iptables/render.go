package iptables

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

const (
	// ChainPrefix makes a chain ours: kernel name = ChainPrefix + rules.Chain.Name.
	ChainPrefix = "NNM-"
	// PredecessorChainPrefix marks the chains of Kakao's network-node-manager, removed by Cleanup.
	PredecessorChainPrefix = "NMANAGER_"
	// jumpCommentPrefix + fix id is the comment of the jump from a built-in chain to a hooked chain.
	jumpCommentPrefix = "network-node-manager:"
	// maxComment is the kernel's limit for -m comment (XT_MAX_COMMENT_LEN minus the NUL).
	maxComment = 255
)

func isOurs(chain string) bool { return strings.HasPrefix(chain, ChainPrefix) }

// KernelChain is the iptables chain name of a rules.Chain.
func KernelChain(name string) string { return ChainPrefix + name }

func tableOf(t rules.ChainType) string {
	switch t {
	case rules.NAT:
		return "nat"
	case rules.Mangle:
		return "mangle"
	}
	return "filter"
}

func builtinOf(h rules.Hook) string { return strings.ToUpper(string(h)) }

// jumpSpec is the rule (after "-A <builtin>") that hooks chain in for fix.
func jumpSpec(fix, chain string) string {
	return "-m comment --comment " + quote(jumpCommentPrefix+fix) + " -j " + chain
}

// tableOps is what one iptables-restore section does to one table, in this order: declare (and so
// flush) chains, append their rules, delete rules (jumps), flush and delete chains, insert jumps.
type tableOps struct {
	decls   []string
	appends []string
	deletes []string
	flushes []string
	removes []string
	inserts []string
	// drains are chains of removes whose every rule goes with them (buckets whose prefix no bucket
	// of the new ruleset has). A plan split into several restores (chunks) empties them in its
	// first, so that the kernel never holds their rules beside those of the chains that replace
	// them; a plan of one restore does not use them (not rendered).
	drains []string
}

func (o *tableOps) empty() bool {
	return len(o.decls)+len(o.appends)+len(o.deletes)+len(o.flushes)+len(o.removes)+len(o.inserts) == 0
}

// plan is a whole iptables-restore --noflush input, by table.
type plan map[string]*tableOps

func (p plan) table(name string) *tableOps {
	if p[name] == nil {
		p[name] = &tableOps{}
	}
	return p[name]
}

var tableOrder = []string{"raw", "mangle", "filter", "nat", "security"}

// String is the plan as iptables-restore input text.
func (p plan) String() string {
	var b bytes.Buffer
	_, _ = io.Copy(&b, p.reader())
	return b.String()
}

// segment is a run of lines of a restore input: prefix + item + suffix each.
type segment struct {
	prefix string
	items  []string
	suffix string
}

// segments is the plan as iptables-restore input, by runs of lines; tables without operations are
// left out. The lines are the plan's own strings: nothing is copied.
func (p plan) segments() []segment {
	var segs []segment
	for _, n := range p.tables() {
		o := p[n]
		segs = append(segs,
			segment{"*", []string{n}, ""},
			segment{":", o.decls, " - [0:0]"},
			segment{"", o.appends, ""},
			segment{"", o.deletes, ""},
			segment{"-F ", o.flushes, ""},
			segment{"-X ", o.removes, ""},
			segment{"", o.inserts, ""},
			segment{"COMMIT", []string{""}, ""})
	}
	return segs
}

// tables are the names of the tables with operations, in restore order.
func (p plan) tables() []string {
	names := make([]string, 0, len(p))
	for n, o := range p {
		if !o.empty() {
			names = append(names, n)
		}
	}
	rank := func(n string) int {
		if i := slices.Index(tableOrder, n); i >= 0 {
			return i
		}
		return len(tableOrder)
	}
	sort.Slice(names, func(i, j int) bool {
		if ri, rj := rank(names[i]), rank(names[j]); ri != rj {
			return ri < rj
		}
		return names[i] < names[j]
	})
	return names
}

// commits is how many transactions the restore of p, a plan of fix, makes: one per table with
// operations, in each of its restores (plan.chunks).
func (p plan) commits(fix string) int {
	n := 0
	for _, c := range p.chunks(p.bound(), fix) {
		n += len(c.tables())
	}
	return n
}

// reader streams the plan as iptables-restore input: one line at a time is assembled, in a buffer
// that is reused (at 10,000 map entries the input is 3.4 MB that is never held whole).
func (p plan) reader() io.Reader { return &segReader{segs: p.segments()} }

type segReader struct {
	segs      []segment
	seg, item int
	line, buf []byte // the rest of the current line; its buffer
}

func (r *segReader) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		if len(r.line) == 0 {
			for r.seg < len(r.segs) && r.item >= len(r.segs[r.seg].items) {
				r.seg, r.item = r.seg+1, 0
			}
			if r.seg == len(r.segs) {
				if n == 0 {
					return 0, io.EOF
				}
				return n, nil
			}
			s := r.segs[r.seg]
			r.buf = append(append(append(append(r.buf[:0], s.prefix...), s.items[r.item]...), s.suffix...), '\n')
			r.line = r.buf
			r.item++
		}
		c := copy(b[n:], r.line)
		r.line = r.line[c:]
		n += c
	}
	return n, nil
}

// hookJump is one jump from a built-in chain to a hooked chain of the fix.
type hookJump struct {
	table, builtin, chain string
}

// rchain is one kernel chain as rendered: its "-A" lines, and for a lookup bucket the chain that
// dispatches to it.
type rchain struct {
	table, name string
	lines       []string
	parent      string
	prefix      netip.Prefix // a bucket's destination prefix
	lookup      string       // a bucket's map
	// unordered: a bucket of a run of one lookup rule that renders one line per key (no mark set
	// or cleared ahead of a verdict, which would be a MARK line before each verdict line). Its
	// lines then are that rule for distinct map keys (address, protocol, port), or source
	// prefixes with the same verdict, so no packet matches two of them with different results, and
	// their order in the kernel does not matter.
	unordered bool
	// node: a node of a lookup run's dispatch tree (see dispatchLeaf): its rules jump to nodes and
	// buckets, and hold the rule of each inlined bucket it lists.
	node bool
	// inlinable: a bucket of a run whose rules have no RETURN verdict, so that its rule, when it has
	// one (inlined), can stand in the chain that lists it (see dispatcher.list).
	inlinable bool
	// holds: the inlined buckets whose rule this chain holds.
	holds []*rchain
}

func (c *rchain) key() tchain { return tchain{c.table, c.name} }

// inlined says whether bucket c is no chain of its own: its one rule stands in the chain that lists
// it instead of that chain's jump to c (dispatcher.list).
func (c *rchain) inlined() bool { return c.inlinable && len(c.lines) == 1 }

// content is what decides whether the chain must be rewritten.
func (c *rchain) content() string { return strings.Join(c.lines, "\n") }

// Lookup sharding: the entries of a map are not expanded into the rule's chain itself but into
// bucket chains, one per destination prefix, and the chain holds one dispatch rule per bucket
// (-d <prefix> -j <bucket>). Buckets are /28 (IPv4) and /124 (IPv6): at most 16 addresses, so a
// packet walks at most 16 addresses' rules in its bucket (with /24 buckets 10,000 consecutive
// External-IPs filled 40 buckets of 256, and a DNATed connection met 128 DNAT and 128 conntrack
// masquerade rules on average). A packet only matches entries of its own destination address, which all
// sit in one bucket in the same relative order as an unsharded expansion, so the semantics are the
// same; a change of one entry rewrites one bucket, and a new connection walks the dispatch rules and
// one bucket instead of every entry.
const (
	bucketBits4 = 28  // IPv4 buckets: /28, at most 16 addresses
	bucketBits6 = 124 // IPv6 buckets: /124, likewise
	// maxChainName is the kernel's limit for a chain name (XT_EXTENSION_MAXNAMELEN minus the NUL).
	maxChainName = 28
)

// bucketPrefix is the bucket of a destination address.
func bucketPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	if a.Is4() {
		return netip.PrefixFrom(a, bucketBits4).Masked()
	}
	return netip.PrefixFrom(a, bucketBits6).Masked()
}

// bucketName is the stable kernel name of the bucket of prefix p for the run-th lookup run (1-based)
// of chain: "NNM-" + chain + "-" + the /28's address in hex (NNM-EXTIP-DNAT-CB007100 for
// 203.0.113.0/28), or 12 hex digits of a SHA-256 of the /124 for IPv6. A chain name too long for the
// 28-character limit is shortened to its start plus 5 hex digits of its hash.
func bucketName(chain string, run int, p netip.Prefix) string { return bucketNameTry(chain, run, p, 0) }

// bucketNameTry is bucketName's try-th candidate. The IPv6 names are 48 bits of a hash that anyone
// who may write a Service's ingress IPs can make collide (two /120s of one tenant's Service did, issue
// #41, when buckets were /120s); the hex of an IPv4 /28 cannot. renderChains takes, for a name already given to a prefix of
// lower address, the next try, whose hash also covers the try's number: a collision renames the
// higher prefix's bucket, never fails the ruleset.
func bucketNameTry(chain string, run int, p netip.Prefix, try int) string {
	var suffix string
	if a := p.Addr(); a.Is4() {
		b := a.As4()
		suffix = upperHex("", b[:]...)
	} else {
		in := p.String()
		if try > 0 {
			in += "#" + strconv.Itoa(try)
		}
		h := sha256.Sum256([]byte(in))
		suffix = upperHex("", h[:6]...)
	}
	return chainWithSuffix(chain, run, suffix)
}

// upperHex is prefix followed by b in upper-case hex digits: what names the buckets and nodes,
// 10,000 of them at a time (fmt.Sprintf was a tenth of a change's rendering among 10,000 scattered
// External-IPs).
func upperHex(prefix string, b ...byte) string {
	var buf [32]byte
	out := hex.AppendEncode(append(buf[:0], prefix...), b)
	for i := len(prefix); i < len(out); i++ {
		if out[i] >= 'a' {
			out[i] -= 'a' - 'A'
		}
	}
	return string(out)
}

// chainWithSuffix is "NNM-" + chain (+ run when > 1) + "-" + suffix, the chain part shortened to its
// start plus 5 hex digits of its hash when the whole would pass the kernel's 28 characters.
func chainWithSuffix(chain string, run int, suffix string) string {
	base := chain
	if run > 1 {
		base += strconv.Itoa(run)
	}
	maxBase := maxChainName - len(ChainPrefix) - 1 - len(suffix)
	if len(base) > maxBase {
		h := sha256.Sum256([]byte(base))
		base = base[:maxBase-5] + upperHex("", h[:3]...)[:5]
	}
	return ChainPrefix + base + "-" + suffix
}

// scope narrows what renderChains renders, for a change of some buckets' entries (applyEntries).
// The zero scope renders everything.
type scope struct {
	// only: the buckets (by map name and prefix) whose rules are rendered; every other bucket is
	// named and dispatched to as all of rs's entries make it, but rendered empty. nil: every bucket.
	only map[string]map[netip.Prefix]bool
	// bucketsOnly: only the buckets are rendered, without their parents: no chain with rules of its
	// own, no dispatch (for a change that keeps every bucket, bucketsKept, these stay as they are).
	bucketsOnly bool
	// recorded: the chains of the record. Without bucketsOnly, the buckets that have none there are
	// rendered too: they are inlined, and the chains that list them hold their rules.
	recorded map[tchain]bool
}

// linesOf is what the run of map lookup with buckets names is rendered from: lines, or when
// sc.recorded names no chain for some buckets outside sc.only, rs narrowed to those and sc.only's;
// rs itself when those are most of the buckets (scattered External-IPs: all of them), which
// renders the other buckets' rules too, and costs less than narrowing to nearly everything.
func (sc scope) linesOf(rs, lines *rules.Ruleset, lookup, table string, names map[netip.Prefix]string) *rules.Ruleset {
	if sc.recorded == nil || sc.bucketsOnly {
		return lines
	}
	var only map[netip.Prefix]bool
	for p, n := range names {
		if !sc.only[lookup][p] && !sc.recorded[tchain{table, n}] {
			if only == nil {
				only = maps.Clone(sc.only[lookup])
				if only == nil {
					only = map[netip.Prefix]bool{}
				}
			}
			only[p] = true
		}
	}
	switch {
	case only == nil:
		return lines
	case 2*len(only) > len(names):
		return rs
	}
	return scope{only: map[string]map[netip.Prefix]bool{lookup: only}}.entriesOf(rs)
}

// named is what bucketNames names of map lookup's buckets: those of sc.only when only buckets are
// rendered (none when the map has no touched bucket), else all (nil).
func (sc scope) named(lookup string) map[netip.Prefix]bool {
	if !sc.bucketsOnly {
		return nil
	}
	if only := sc.only[lookup]; only != nil {
		return only
	}
	return map[netip.Prefix]bool{}
}

// renderChains renders the chains of rs, each followed by its lookup buckets, and the jumps that hook
// them in; sc narrows it (scope).
func renderChains(rs *rules.Ruleset, sc scope) ([]*rchain, []hookJump, error) {
	var out []*rchain
	var jumps []hookJump
	var ln lineBuf
	names := kernelNames(rs)
	lines := rs // whose map entries are rendered into buckets
	if sc.only != nil {
		lines = sc.entriesOf(rs)
	}
	for _, c := range rs.Chains {
		t := tableOf(c.Type)
		name := KernelChain(c.Name)
		parent := &rchain{table: t, name: name}
		if !sc.bucketsOnly {
			out = append(out, parent)
		}
		run := 0
		for i := 0; i < len(c.Rules); {
			r := c.Rules[i]
			if !bucketed(r.Match) {
				err := ln.render(rs, c, r, func(_ netip.Addr, spec []byte) error {
					parent.lines = append(parent.lines, ln.line(name, spec))
					return nil
				})
				if err != nil {
					return nil, nil, fmt.Errorf("chain %s rule %d: %w", c.Name, i+1, err)
				}
				i++
				continue
			}
			// A run of consecutive rules on the same map shares its buckets: inside a bucket the
			// rules keep their order (say all MARK rules of the bucket's entries, then all DNAT rules).
			run++
			lookup := r.Match.Lookup
			first, end := i, runEnd(c, i)
			unordered := end-first == 1 && oneLinePerKey(r)
			inlinable := !slices.ContainsFunc(c.Rules[first:end], func(r rules.Rule) bool { return r.Verdict.Kind == rules.Return })
			runNames := bucketNames(rs, c, first, t, run, names, sc.named(lookup))
			runLines := sc.linesOf(rs, lines, lookup, t, runNames)
			buckets := make(map[netip.Prefix]*rchain, len(runNames))
			prefixes := make([]netip.Prefix, 0, len(runNames))
			for p, n := range runNames {
				buckets[p] = &rchain{table: t, name: n, parent: name, prefix: p, lookup: lookup, unordered: unordered, inlinable: inlinable}
				prefixes = append(prefixes, p)
			}
			sort.Slice(prefixes, func(a, b int) bool { return prefixes[a].Addr().Less(prefixes[b].Addr()) })
			inBucket := func(dst netip.Addr, spec []byte) error {
				if !dst.IsValid() {
					return errors.New("map entry without an address")
				}
				bc := buckets[bucketPrefix(dst)]
				if bc == nil { // bucketNames and ln.render expand the same entries
					return fmt.Errorf("map entry %s has no bucket", dst)
				}
				bc.lines = append(bc.lines, ln.line(bc.name, spec))
				return nil
			}
			for ; i < end; i++ {
				if err := ln.render(runLines, c, c.Rules[i], inBucket); err != nil {
					return nil, nil, fmt.Errorf("chain %s rule %d: %w", c.Name, i+1, err)
				}
			}
			if sc.bucketsOnly {
				for _, p := range prefixes {
					if sc.only[lookup][p] {
						buckets[p].parent = ""
						out = append(out, buckets[p])
					}
				}
				continue
			}
			d := dispatcher{chain: c.Name, run: run, table: t, names: names, buckets: buckets, out: out}
			d.emit(parent, prefixes, 0)
			out = d.out
		}
		if c.Hook != "" {
			jumps = append(jumps, hookJump{t, builtinOf(c.Hook), name})
		}
	}
	seen := map[tchain]bool{}
	for _, c := range out {
		if seen[c.key()] {
			return nil, nil, fmt.Errorf("kernel chain %s is rendered twice (a lookup bucket name collides)", c.name)
		}
		seen[c.key()] = true
	}
	return out, jumps, nil
}

// entriesOf is rs with each map narrowed to the entries of the buckets of sc.only (sub-slices of
// the sorted entries: nothing is copied but the slice headers).
func (sc scope) entriesOf(rs *rules.Ruleset) *rules.Ruleset {
	out := *rs
	out.Maps = make([]rules.Map, len(rs.Maps))
	for i := range rs.Maps {
		name := rs.Maps[i].Name
		out.Maps[i].Name = name
		sorted := rs.Maps[i].Sorted()
		ps := slices.SortedFunc(maps.Keys(sc.only[name]), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		for _, p := range ps {
			out.Maps[i].Entries = append(out.Maps[i].Entries, bucketEntries(sorted, p)...)
		}
	}
	return &out
}

// kernelNames is the set of kernel names that rs's chains take before any bucket or node is named:
// the chains' own.
func kernelNames(rs *rules.Ruleset) map[tchain]bool {
	names := make(map[tchain]bool, len(rs.Chains))
	for _, c := range rs.Chains {
		names[tchain{tableOf(c.Type), KernelChain(c.Name)}] = true
	}
	return names
}

// runEnd is the end (exclusive) of the run of rules of c that starts at rule first: consecutive
// lookups of one map into buckets (sameRun), or the one rule first when it is not one (bucketed).
func runEnd(c rules.Chain, first int) int {
	end := first + 1
	if !bucketed(c.Rules[first].Match) {
		return end
	}
	for end < len(c.Rules) && sameRun(c.Rules[end].Match, c.Rules[first].Match) {
		end++
	}
	return end
}

// sameRun says whether two lookup matches belong to one run of bucket chains: the same map, looked
// up by the same key (a lookup by original destination after a run of its map is not of the run).
func sameRun(a, b rules.Match) bool { return a.Lookup == b.Lookup && a.LookupKey == b.LookupKey }

// bucketed says whether a rule with match m expands its map's entries into bucket chains: a lookup of
// the packet's destination. A lookup by the connection's original destination is one rule that
// matches the map's conntrack label (internal/connlabel).
func bucketed(m rules.Match) bool { return m.Lookup != "" && m.LookupKey == rules.LookupPacket }

// Dispatch tree: with more than dispatchLeaf buckets, the dispatching rules are not one per bucket in
// the chain (a new connection to no entry would walk all of them: 10,000 rules with 10,000 scattered
// External-IPs) but a tree over the prefix bits of the buckets, dispatchStride bits per level. A set
// of buckets is split by the dispatchStride bits that follow the set's common prefix (up to 16
// groups); a group of one bucket is jumped to directly, a larger group through a node chain that
// matches the group's own common prefix and splits it again, down to sets of at most dispatchLeaf
// buckets listed one rule each. A packet matches the destination of at most one rule per chain (the
// groups are disjoint), so it meets at most 16 rules in each of a few chains: 4 levels for 50,000
// random /24s. Why 4 bits: what a new connection pays is mostly the chains it enters, each a cold
// block of rules in the kernel, more than the rules it walks in one (bench/datapath, 50,000 scattered
// entries, one run each: +16.5 µs per DNATed connection with 2 bits and 4 buckets a leaf, +6.9 with 4
// and 16, +11.8 with 8 and 64). The dispatch rules carry no comment: iptables-nft runs -m comment as
// an xt match, about 0.25 µs for each rule a connection walks; a node's name says its prefix. Below
// dispatchDepth nodes the rest of a set is listed linearly: nf_tables refuses rulesets whose jumps nest 16 deep
// (NFT_JUMP_STACK_SIZE), and whoever writes a Service's ingress IPs could otherwise choose IPv6
// prefixes that nest a node per level. The nodes depend on which buckets exist and on the rules of
// the inlined ones (dispatcher.list), so a change inside a bucket rewrites that bucket alone, or
// the node that holds it inlined; a bucket that appears or goes rewrites the node (or the chain)
// that lists it, and splits or merges at most one node more.
const (
	dispatchLeaf   = 16
	dispatchStride = 4
	dispatchDepth  = 8
)

// dispatcher emits the dispatch of one lookup run: its rules into the chain and its nodes, and the
// buckets behind them, in order, into out.
type dispatcher struct {
	chain   string
	run     int
	table   string
	names   map[tchain]bool
	buckets map[netip.Prefix]*rchain
	out     []*rchain
}

func (d *dispatcher) line(from *rchain, p netip.Prefix, to string) {
	from.lines = append(from.lines, "-A "+from.name+" -d "+p.String()+" -j "+to)
}

// list dispatches bucket p from chain from: a rule that jumps to the bucket's chain or, when the
// bucket is inlined, the bucket's one rule itself. That rule matches the entry's address, inside
// the prefix the jump would have matched, and does not RETURN: the packets it takes meet the same
// rules, and the chain continues as after the bucket. A new connection to a scattered External-IP
// (one entry to a bucket) then enters one chain fewer: with 10,000 such entries, 0.1-0.6 µs less per
// DNATed connection (medians), and programming them took 0.64-0.98 s instead of 2.4-3.1 s
// (backends/iptables/README.md, "Inlined buckets").
func (d *dispatcher) list(from *rchain, p netip.Prefix) {
	bc := d.buckets[p]
	bc.parent = from.name
	if bc.inlined() {
		from.lines = append(from.lines, "-A "+from.name+strings.TrimPrefix(bc.lines[0], "-A "+bc.name))
		from.holds = append(from.holds, bc)
		return
	}
	d.line(from, p, bc.name)
	d.out = append(d.out, bc)
}

// emit dispatches the buckets of ps (sorted by address) from chain from, a node at depth depth (0:
// the lookup's own chain).
func (d *dispatcher) emit(from *rchain, ps []netip.Prefix, depth int) {
	if len(ps) <= dispatchLeaf || depth >= dispatchDepth {
		for _, p := range ps {
			d.list(from, p)
		}
		return
	}
	end := min(commonPrefix(ps[0], ps[len(ps)-1]).Bits()+dispatchStride, ps[0].Bits())
	for i := 0; i < len(ps); {
		g := netip.PrefixFrom(ps[i].Addr(), end).Masked()
		j := i + 1
		for j < len(ps) && g.Contains(ps[j].Addr()) {
			j++
		}
		group := ps[i:j]
		i = j
		if len(group) == 1 {
			d.list(from, group[0])
			continue
		}
		np := commonPrefix(group[0], group[len(group)-1])
		n := nodeName(d.chain, d.run, np, 0)
		for try := 1; d.names[tchain{d.table, n}]; try++ {
			n = nodeName(d.chain, d.run, np, try)
		}
		d.names[tchain{d.table, n}] = true
		node := &rchain{table: d.table, name: n, parent: from.name, node: true}
		d.line(from, np, n)
		d.out = append(d.out, node)
		d.emit(node, group, depth+1)
	}
}

// commonPrefix is the longest prefix that holds both a and b (of one family).
func commonPrefix(a, b netip.Prefix) netip.Prefix {
	bits := min(a.Bits(), b.Bits())
	x, y := a.Addr().AsSlice(), b.Addr().AsSlice()
	n := 0
	for n < bits && addrBitOf(x, n) == addrBitOf(y, n) {
		n++
	}
	return netip.PrefixFrom(a.Addr(), n).Masked()
}

// addrBit reports whether bit i (0 the highest) of a is set.
func addrBit(a netip.Addr, i int) bool { return addrBitOf(a.AsSlice(), i) }

func addrBitOf(b []byte, i int) bool { return b[i/8]&(0x80>>(i%8)) != 0 }

// nodeName is the try-th candidate kernel name of the dispatch node for prefix p of the run-th
// lookup run of chain: "NNM-" + chain + "-T" + the prefix's IPv4 address and length in hex
// (NNM-EXTIP-DNAT-TCB000000 08 for 203.0.0.0/8, without the space), or "T" + 12 hex digits of a
// SHA-256 of the IPv6 prefix (and the try, as bucketNameTry). Neither can be a bucket's name: those
// have no T.
func nodeName(chain string, run int, p netip.Prefix, try int) string {
	if a := p.Addr(); a.Is4() {
		b := a.As4()
		return chainWithSuffix(chain, run, upperHex("T", b[0], b[1], b[2], b[3], byte(p.Bits())))
	}
	in := "node " + p.String()
	if try > 0 {
		in += "#" + strconv.Itoa(try)
	}
	h := sha256.Sum256([]byte(in))
	return chainWithSuffix(chain, run, upperHex("T", h[:6]...))
}

// bucketNames names the buckets of the lookup run that starts at rule first of chain c (the run-th of
// the chain, in table t): every prefix that an entry the run expands falls in, in address order, gets
// bucketName unless a chain already in names has it (a collision), else its next try. names gets
// the names given. A non-nil only narrows it to those prefixes: a change that keeps every bucket
// (scope.bucketsOnly) names the buckets it renders and not the thousands it leaves as they are.
// Those are named without the other buckets in names, so where the full naming would have taken a
// next try (a collision, which needs two IPv6 prefixes of the same hash) the name differs from the
// record's, and applyEntries, finding no such chain or other rules in it, takes the full way.
func bucketNames(rs *rules.Ruleset, c rules.Chain, first int, t string, run int, names map[tchain]bool, only map[netip.Prefix]bool) map[netip.Prefix]string {
	head := c.Rules[first].Match
	m := rs.Map(head.Lookup)
	if m == nil {
		return nil
	}
	var prefixes []netip.Prefix
	add := func(entries []rules.MapEntry) {
		for _, e := range entries { // sorted by address: a bucket's entries are consecutive
			p := bucketPrefix(e.Addr)
			if len(prefixes) > 0 && prefixes[len(prefixes)-1] == p {
				continue
			}
			for i := first; i < len(c.Rules) && sameRun(c.Rules[i].Match, head); i++ {
				if expands(c.Rules[i].Match, &e) {
					prefixes = append(prefixes, p)
					break
				}
			}
		}
	}
	if only == nil {
		add(m.Sorted())
	} else {
		sorted := m.Sorted()
		for _, p := range slices.SortedFunc(maps.Keys(only), func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) }) {
			add(bucketEntries(sorted, p))
		}
	}
	out := make(map[netip.Prefix]string, len(prefixes))
	for _, p := range prefixes {
		n := bucketName(c.Name, run, p)
		for try := 1; names[tchain{t, n}]; try++ {
			n = bucketNameTry(c.Name, run, p, try)
		}
		names[tchain{t, n}] = true
		out[p] = n
	}
	return out
}

// oneLinePerKey says whether r renders one kernel rule per destination and source prefix: not a
// MARK rule ahead of its verdict rule.
func oneLinePerKey(r rules.Rule) bool {
	return (r.SetMark == 0 && r.ClearMark == 0) || r.Verdict.Kind == rules.Continue
}

// planRuleset renders the chains of rs (declarations and rules) and, for a kernel without any of them,
// the jumps. It also returns the rendered chains and the jumps.
func planRuleset(rs *rules.Ruleset) (plan, []*rchain, []hookJump, error) {
	chains, jumps, err := renderChains(rs, scope{})
	if err != nil {
		return nil, nil, nil, err
	}
	p := plan{}
	for _, c := range chains {
		ops := p.table(c.table)
		ops.decls = append(ops.decls, c.name)
		ops.appends = append(ops.appends, c.lines...)
	}
	addInserts(p, rs.Fix, jumps)
	return p, chains, jumps, nil
}

// addInserts adds the jumps at position 1; inserting in reverse keeps the chains in declaration order.
func addInserts(p plan, fix string, jumps []hookJump) {
	for i := len(jumps) - 1; i >= 0; i-- {
		j := jumps[i]
		p.table(j.table).inserts = append(p.table(j.table).inserts, "-I "+j.builtin+" 1 "+jumpSpec(fix, j.chain))
	}
}

// expands reports whether a lookup rule with match m expands map entry e into kernel rules: the
// rule's own destination match narrows the map.
func expands(m rules.Match, e *rules.MapEntry) bool {
	return (!m.DstAddr.IsValid() || m.DstAddr == e.Addr) && (m.Protocol == "" || m.Protocol == e.Protocol) && (m.DstPort == 0 || m.DstPort == e.Port)
}

// target is what one expanded rule matches on top of the rule's own match (one map entry).
type target struct {
	dst      netip.Addr
	proto    rules.Protocol
	port     uint16
	to       netip.AddrPort
	comment  string
	fromEntr bool
	// label (a bit of conntrack's labels, internal/connlabel; 0: none) is matched, or set by a rule that
	// DNATs by a map whose connections a lookup by original destination finds (setLabel).
	label    int
	setLabel bool
}

// lineBuf is the scratch space of a rendering: every kernel rule is assembled in it and leaves it as
// one string, its only allocation (at 10,000 map entries a full rendering makes 20,000 of them).
type lineBuf struct{ spec, out []byte }

// line is "-A chain spec", in one allocation.
func (l *lineBuf) line(chain string, spec []byte) string {
	l.out = append(append(append(append(l.out[:0], "-A "...), chain...), ' '), spec...)
	return string(l.out)
}

// entryComments: the rules a map entry expands to carry no comment (unless counted: Counters finds a
// counted rule by its comment). iptables-nft keeps a comment as an xt match of 256 bytes whatever
// its length, charged to the agent's memory cgroup with the rule: measured on kernel 6.18 with
// iptables 1.8.9 (nf_tables), 10,000 rules restored in a memory cgroup, a DNAT rule of an entry costs
// 1,130 bytes of kernel memory with its comment and 729 without, the masquerade rule 1,522 and 865,
// so 2.6 KiB per entry became 1.6 KiB (the DNAT fix: 50,000 entries, 127 → 78 MiB). The bucket's
// chain name and the dispatch rules' comments still say which map and prefix a rule belongs to; the
// entry (address, protocol, port, destination) is the rule's own match.

// render passes emit the spec (after "-A CHAIN") of each kernel rule that stands for r, with the
// destination address it matches, if any: one per source prefix and per map entry, and a MARK rule
// before the verdict rule when r sets or clears a mark and has a verdict. spec is only valid during
// the call.
func (l *lineBuf) render(rs *rules.Ruleset, c rules.Chain, r rules.Rule, emit func(dst netip.Addr, spec []byte) error) error {
	m := r.Match
	for _, ifp := range []string{m.InInterfacePrefix, m.OutInterfacePrefix} {
		if ifp != "" {
			if err := rules.ValidInterfacePrefix(ifp); err != nil {
				return err
			}
		}
	}
	prefixes := m.SrcPrefixes
	if len(prefixes) == 0 {
		prefixes = []netip.Prefix{{}}
	}
	verdict, err := renderVerdict(rs, r.Verdict)
	if err != nil {
		return err
	}
	dnat := r.Verdict.Kind == rules.DNAT || r.Verdict.Kind == rules.DNATLookup
	label, err := labelOf(rs, r)
	if err != nil {
		return err
	}
	for tg := range targetsOf(rs, r, label) {
		if dnat && tg.to.Port() != 0 && tg.proto == "" {
			return fmt.Errorf("dnat to a port needs Match.Protocol")
		}
		dsts := m.DstPrefixes
		if tg.dst.IsValid() {
			a := tg.dst.Unmap()
			dsts = []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}
		}
		if len(dsts) == 0 {
			dsts = []netip.Prefix{{}}
		}
		for _, p := range prefixes {
			for _, d := range dsts {
				b := appendMatch(l.spec[:0], m, tg, p, d)
				matchLen := len(b)
				withComment := func(counter string) []byte {
					if tg.fromEntr && counter == "" {
						return b[:matchLen] // a map entry's rule: see entryComments
					}
					return appendQuoted(append(b[:matchLen], " -m comment --comment "...), ruleComment(rs.Fix, counter, tg.comment))
				}
				if r.SetMark != 0 || r.ClearMark != 0 {
					counter := r.Counter
					if r.Verdict.Kind != rules.Continue {
						counter = ""
					}
					if r.SetMark != 0 {
						b = strconv.AppendUint(append(withComment(counter), " -j MARK --or-mark 0x"...), uint64(r.SetMark), 16)
					} else {
						b = strconv.AppendUint(append(withComment(counter), " -j MARK --and-mark 0x"...), uint64(^r.ClearMark), 16)
					}
					l.spec = b
					if err := emit(tg.dst, bytes.TrimSpace(b)); err != nil {
						return err
					}
					if r.Verdict.Kind == rules.Continue {
						continue
					}
				}
				b = withComment(r.Counter)
				if dnat {
					b = appendDNATTo(append(b, " -j DNAT --to-destination "...), tg.to)
				} else {
					b = append(b, verdict...)
				}
				l.spec = b
				if err := emit(tg.dst, bytes.TrimSpace(b)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// appendMatch appends the match options of one rendered rule: source p, destination d, and the
// target's protocol and port.
func appendMatch(b []byte, m rules.Match, tg target, p, d netip.Prefix) []byte {
	if p.IsValid() {
		b = unmapPrefix(p).AppendTo(append(b, " -s "...))
	}
	if d.IsValid() {
		b = unmapPrefix(d).AppendTo(append(b, " -d "...))
	}
	if m.InInterfacePrefix != "" {
		b = append(append(append(b, " -i "...), m.InInterfacePrefix...), '+')
	}
	if m.OutInterfacePrefix != "" {
		b = append(append(append(b, " -o "...), m.OutInterfacePrefix...), '+')
	}
	if tg.proto != "" {
		b = append(append(b, " -p "...), tg.proto...)
		if tg.port != 0 || m.TCPFlags.Mask != 0 {
			b = append(append(b, " -m "...), tg.proto...)
		}
		if tg.port != 0 {
			b = strconv.AppendUint(append(b, " --dport "...), uint64(tg.port), 10)
		}
		if m.TCPFlags.Mask != 0 {
			b = fmt.Appendf(b, " --tcp-flags %s %s", iptFlags(m.TCPFlags.Mask), iptFlags(m.TCPFlags.Set))
		}
	}
	if m.SrcAddrType != "" {
		b = append(append(b, " -m addrtype --src-type "...), strings.ToUpper(string(m.SrcAddrType))...)
	}
	if len(m.CTStates) > 0 {
		b = append(b, " -m conntrack --ctstate "...)
		for i, s := range m.CTStates {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, strings.ToUpper(string(s))...)
		}
	}
	// A matched label goes before the status (a match of its own: the states above are a list of
	// alternatives): both are xt matches, and a connection without the label, the common case,
	// meets only the first.
	if tg.label != 0 && !tg.setLabel {
		b = appendLabel(b, tg)
	}
	if m.CTStatus != "" {
		b = append(append(b, " -m conntrack --ctstate "...), strings.ToUpper(string(m.CTStatus))...)
	}
	if m.Mark != 0 {
		b = fmt.Appendf(b, " -m mark --mark 0x%x/0x%x", m.Mark, m.Mark)
	}
	// A set label last, so that only the packets every native match above took run it.
	if tg.setLabel {
		b = appendLabel(b, tg)
	}
	return b
}

// appendLabel appends tg's -m connlabel match (internal/connlabel), which sets the label for setLabel.
func appendLabel(b []byte, tg target) []byte {
	b = strconv.AppendInt(append(b, " -m connlabel --label "...), int64(tg.label), 10)
	if tg.setLabel {
		b = append(b, " --set"...)
	}
	return b
}

// targetsOf yields what a rule is rendered for: each map entry its lookup expands, or its own match
// (a lookup by original destination: its map's label, which the rule matches). label is labelOf's.
func targetsOf(rs *rules.Ruleset, r rules.Rule, label int) iter.Seq[target] {
	m := r.Match
	return func(yield func(target) bool) {
		if !bucketed(m) {
			yield(target{dst: m.DstAddr, proto: m.Protocol, port: m.DstPort, to: r.Verdict.To, comment: r.Comment, label: label})
			return
		}
		for _, e := range rs.Map(m.Lookup).Sorted() {
			if !expands(m, &e) {
				continue
			}
			cm := e.Comment
			if cm == "" {
				cm = r.Comment
			}
			if !yield(target{dst: e.Addr, proto: e.Protocol, port: e.Port, to: e.To, comment: cm, fromEntr: true, label: label, setLabel: label != 0}) {
				return
			}
		}
	}
}

func renderVerdict(rs *rules.Ruleset, v rules.Verdict) (string, error) {
	switch v.Kind {
	case rules.Continue:
		return "", nil
	case rules.Accept:
		return " -j ACCEPT", nil
	case rules.Drop:
		return " -j DROP", nil
	case rules.Return:
		return " -j RETURN", nil
	case rules.Jump:
		return " -j " + KernelChain(v.Chain), nil
	case rules.Masquerade:
		return " -j MASQUERADE", nil
	case rules.DNAT, rules.DNATLookup:
		return "", nil // per target
	case rules.ClampMSS:
		if v.MSS == 0 {
			return " -j TCPMSS --clamp-mss-to-pmtu", nil
		}
		return fmt.Sprintf(" -j TCPMSS --set-mss %d", v.MSS), nil
	}
	return "", fmt.Errorf("unknown verdict %q", v.Kind)
}

// iptFlags is a flag set in iptables' --tcp-flags notation ("SYN,RST"; "NONE" when empty).
func iptFlags(f rules.TCPFlag) string {
	if f == 0 {
		return "NONE"
	}
	return strings.ToUpper(strings.Join(f.Names(), ","))
}

// appendDNATTo appends DNAT's --to-destination value: the address, with the port when there is one
// (IPv6 in brackets).
func appendDNATTo(b []byte, to netip.AddrPort) []byte {
	a := to.Addr().Unmap()
	if to.Port() == 0 {
		return a.AppendTo(b)
	}
	if a.Is6() {
		b = append(a.AppendTo(append(b, '[')), ']')
	} else {
		b = a.AppendTo(b)
	}
	return strconv.AppendUint(append(b, ':'), uint64(to.Port()), 10)
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix into its IPv4 prefix and masks it.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() {
		bits := p.Bits() - 96
		if bits < 0 {
			bits = 0
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), bits)
	}
	return p.Masked()
}

// ruleComment is "<fix>: <comment>", or "<fix>/<counter>: <comment>" for a counted rule, which is how
// Counters finds the rule again in iptables-save output.
func ruleComment(fix, counter, comment string) string {
	head := fix
	if counter != "" {
		head += "/" + counter
	}
	if comment != "" {
		head += ": " + comment
	}
	return sanitizeComment(head)
}

// counted reports whether a rule comment names a counter ("<fix>/<counter>: ...", see ruleComment).
func counted(comment string) bool {
	head, _, _ := strings.Cut(comment, ": ")
	return strings.Contains(head, "/")
}

// counterOf extracts the counter name from a comment made by ruleComment.
func counterOf(fix, comment string) (string, bool) {
	rest, ok := strings.CutPrefix(comment, fix+"/")
	if !ok {
		return "", false
	}
	name, _, _ := strings.Cut(rest, ": ")
	return name, name != ""
}

// sanitizeComment replaces control characters (a newline would end the restore line) and cuts the
// comment to the kernel's limit on a UTF-8 boundary.
func sanitizeComment(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	for len(s) > maxComment {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// quote double-quotes s for iptables-restore, escaping what iptables-save escapes.
func quote(s string) string { return string(appendQuoted(nil, s)) }

// appendQuoted appends s quoted for iptables-restore (see quote).
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"', '\\', '\'':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}
