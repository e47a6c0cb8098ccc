// Package rules is the backend-neutral model in which fixes describe the netfilter state they want.
//
// A fix returns one Ruleset per IP family. A Ruleset is a set of chains (some hooked into the kernel's
// netfilter hooks, some only jumped to) and lookup maps. Backends (iptables, nftables) render a Ruleset
// into their own syntax and apply it atomically; nothing here talks to the kernel.
package rules

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Family is an IP family. IPv4 and IPv6 share every code path and differ only by this value.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Families lists the supported families in a stable order.
var Families = []Family{IPv4, IPv6}

// ParseFamily accepts "ipv4"/"4" and "ipv6"/"6".
func ParseFamily(s string) (Family, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "ipv4", "4", "inet4":
		return IPv4, nil
	case "ipv6", "6", "inet6":
		return IPv6, nil
	}
	return "", fmt.Errorf("unknown IP family %q (want ipv4 or ipv6)", s)
}

// Contains reports whether addr belongs to the family.
func (f Family) Contains(addr netip.Addr) bool {
	if f == IPv4 {
		return addr.Is4() || addr.Is4In6()
	}
	return addr.Is6() && !addr.Is4In6()
}

// Prefixes returns the prefixes of list that belong to the family (Contains their address), in
// their order; nil when none does. A fix's Rules keep one family of a configured list with it.
func (f Family) Prefixes(list []netip.Prefix) []netip.Prefix {
	return ofFamily(f, list, netip.Prefix.Addr)
}

// Addrs returns the addresses of list that belong to the family, in their order; nil when none does.
func (f Family) Addrs(list []netip.Addr) []netip.Addr {
	return ofFamily(f, list, func(a netip.Addr) netip.Addr { return a })
}

func ofFamily[T any](f Family, list []T, addr func(T) netip.Addr) []T {
	var out []T
	for _, v := range list {
		if f.Contains(addr(v)) {
			out = append(out, v)
		}
	}
	return out
}

// ChainType selects the netfilter table the chain lives in: packet filtering, address translation, or
// packet alteration (mangle, which runs before filter on the same hook).
type ChainType string

const (
	Filter ChainType = "filter"
	NAT    ChainType = "nat"
	Mangle ChainType = "mangle"
)

// Hook is a netfilter hook. A chain with an empty Hook is a regular chain, reached only by Jump.
type Hook string

const (
	Prerouting  Hook = "prerouting"
	Input       Hook = "input"
	Forward     Hook = "forward"
	Output      Hook = "output"
	Postrouting Hook = "postrouting"
)

// ParseHook accepts a hook name in any case.
func ParseHook(s string) (Hook, error) {
	return parseName(s, "netfilter hook", hooks...)
}

var hooks = []Hook{Prerouting, Input, Forward, Output, Postrouting}

// Protocol is a transport protocol. The empty Protocol matches any protocol.
type Protocol string

const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// ParseProtocol accepts tcp, udp and sctp in any case.
func ParseProtocol(s string) (Protocol, error) {
	return parseName(s, "protocol", protocols...) // a variable: a variadic list here was allocated per call
}

var protocols = []Protocol{TCP, UDP, SCTP}

// parseName accepts one of names in any case, with surrounding space; what says in the error what
// kind of name s is not.
func parseName[T ~string](s, what string, names ...T) (T, error) {
	v := strings.TrimSpace(s)
	for _, n := range names {
		if equalFoldASCII(v, string(n)) {
			return n, nil
		}
	}
	want := make([]string, len(names))
	for i, n := range names {
		want[i] = string(n)
	}
	last := len(want) - 1
	return "", fmt.Errorf("unknown %s %q (want %s or %s)", what, s, strings.Join(want[:last], ", "), want[last])
}

// equalFoldASCII says whether s is lower (a lower-case ASCII name) in any ASCII case. Unlike
// strings.EqualFold it folds nothing else (a long s is not an s), and unlike strings.ToLower it
// copies nothing: protocols are parsed for every port of every Service.
func equalFoldASCII(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// CTState is a conntrack state.
type CTState string

const (
	CTInvalid     CTState = "invalid"
	CTNew         CTState = "new"
	CTEstablished CTState = "established"
	CTRelated     CTState = "related"
)

// CTStatus is a bit of a connection's conntrack status.
type CTStatus string

// CTDNAT: the connection's destination was translated by a DNAT rule (nf_nat: iptables' DNAT, nft's
// dnat). IPVS's forwarding does not set it: IPVS rewrites the conntrack reply tuple itself.
const CTDNAT CTStatus = "dnat"

// LookupKey says what a Match.Lookup looks up in its map.
type LookupKey string

const (
	// LookupPacket (the zero value) looks up the packet's destination address, protocol and
	// destination port.
	LookupPacket LookupKey = ""
	// LookupCTOriginal finds, in postrouting, the connections that a DNATLookup on the same map (in
	// the same Ruleset, which Validate requires) translated, without a packet mark that any other
	// component may set or clear: by the connection's original destination (conntrack's original
	// tuple: the address, protocol and port the connection was opened to, before any DNAT). How a
	// backend finds them is its own: nftables looks the original destination up in the map (so it
	// also finds a connection another component DNATed from a key, with the rule's CTStatus);
	// iptables, which can only walk rules, has the DNATLookup's rules put a conntrack label on the
	// connections they translate and matches the label, one match whatever the map's size.
	LookupCTOriginal LookupKey = "ct-original"
)

// TCPFlag is a set of TCP header flags (bits of the flags byte).
type TCPFlag uint8

const (
	FIN TCPFlag = 0x01
	SYN TCPFlag = 0x02
	RST TCPFlag = 0x04
	PSH TCPFlag = 0x08
	ACK TCPFlag = 0x10
	URG TCPFlag = 0x20
)

// TCPFlagNames lists the flags in header bit order with their lower-case names.
var TCPFlagNames = []struct {
	Flag TCPFlag
	Name string
}{{FIN, "fin"}, {SYN, "syn"}, {RST, "rst"}, {PSH, "psh"}, {ACK, "ack"}, {URG, "urg"}}

// Names returns the lower-case names of the flags set in f, in header bit order.
func (f TCPFlag) Names() []string {
	var out []string
	for _, n := range TCPFlagNames {
		if f&n.Flag != 0 {
			out = append(out, n.Name)
		}
	}
	return out
}

// TCPFlags matches TCP segments whose flags, masked by Mask, equal Set (iptables --tcp-flags MASK SET).
// A zero Mask matches every segment.
type TCPFlags struct {
	Mask, Set TCPFlag
}

// SYNNotRST matches SYN and SYN-ACK segments (SYN set, RST clear): the segments that carry the MSS
// option, as iptables' TCPMSS target requires.
var SYNNotRST = TCPFlags{Mask: SYN | RST, Set: SYN}

// AddrType is an address type as the routing table classifies it.
type AddrType string

// Local is an address configured on this host.
const Local AddrType = "local"

// VerdictKind says what a rule does with a matching packet.
type VerdictKind string

const (
	// Continue only applies the rule's side effects (SetMark, ClearMark, counter) and goes on to the
	// next rule.
	Continue   VerdictKind = ""
	Accept     VerdictKind = "accept"
	Drop       VerdictKind = "drop"
	Return     VerdictKind = "return"
	Jump       VerdictKind = "jump"
	DNAT       VerdictKind = "dnat"
	Masquerade VerdictKind = "masquerade"
	// DNATLookup translates the destination to the target that the rule's Match.Lookup map holds for
	// the packet's (destination address, protocol, destination port).
	DNATLookup VerdictKind = "dnat-lookup"
	// ClampMSS lowers the MSS option of a TCP SYN or SYN-ACK to Verdict.MSS, or with a zero MSS to the
	// path MTU of the packet's route minus the IP and TCP headers, and goes on to the next rule. It
	// never raises an MSS. The rule must match Protocol tcp and TCPFlags with SYN set (SYNNotRST);
	// the path-MTU form works only from forward, output and postrouting (it needs the route).
	ClampMSS VerdictKind = "clamp-mss"
)

// Verdict is the terminating part of a rule.
type Verdict struct {
	Kind VerdictKind
	// Chain is the target of Jump: the name of another chain of the same Ruleset.
	Chain string
	// To is the new destination of DNAT. A zero port keeps the original port.
	To netip.AddrPort
	// MSS is the value ClampMSS lowers the MSS option to; zero clamps to the route's path MTU.
	MSS uint16
}

// Match selects packets. Empty fields match everything; all set fields must match.
type Match struct {
	// SrcPrefixes matches a source address in any of the prefixes.
	SrcPrefixes []netip.Prefix
	// DstPrefixes matches a destination address in any of the prefixes (not together with DstAddr).
	DstPrefixes []netip.Prefix
	// InInterfacePrefix matches an input interface whose name starts with this prefix.
	InInterfacePrefix string
	// OutInterfacePrefix matches an output interface whose name starts with this prefix (only where
	// the output interface is known: forward, output, postrouting).
	OutInterfacePrefix string
	// SrcAddrType matches the type of the source address.
	SrcAddrType AddrType
	// DstAddr matches one destination address.
	DstAddr  netip.Addr
	Protocol Protocol
	// DstPort needs Protocol.
	DstPort uint16
	// TCPFlags matches TCP flags; it needs Protocol tcp.
	TCPFlags TCPFlags
	// CTStates matches any of the conntrack states.
	CTStates []CTState
	// CTStatus matches packets of connections whose conntrack status has this bit.
	CTStatus CTStatus
	// Mark matches packets whose mark has all these bits set.
	Mark uint32
	// Lookup matches packets whose (destination address, protocol, destination port) is a key of the
	// named Map of the same Ruleset; with LookupKey LookupCTOriginal, whose connection's original
	// destination is.
	Lookup    string
	LookupKey LookupKey
}

// Rule is one match and what to do with matching packets.
type Rule struct {
	Match Match
	// SetMark ORs these bits into the packet mark before the verdict.
	SetMark uint32
	// ClearMark clears these bits of the packet mark before the verdict (not in a rule with SetMark).
	// A mark set ahead of a terminal lookup and cleared after it marks exactly the packets the
	// lookup took, with one rule per map entry in iptables instead of two.
	ClearMark uint32
	Verdict   Verdict
	// Counter names a counter whose packets/bytes backends can report (see Backend.Counters).
	// Names are unique within a Ruleset.
	Counter string
	// Comment is shown in the kernel's ruleset (at most MaxComment bytes).
	Comment string
}

// Chain is an ordered list of rules. A chain with a Hook is attached to the kernel's hook of that
// name (iptables: jumped to from the built-in chain; nftables: a base chain).
type Chain struct {
	// Name is short, upper-case and unique within the fix, e.g. "INVALID-INPUT". Backends prefix
	// it to make it theirs ("NNM-INVALID-INPUT" in iptables).
	Name  string
	Type  ChainType
	Hook  Hook
	Rules []Rule
	// Precedes names the foreign chains (kube-proxy's KUBE-SERVICES, say) that can end this
	// packet's walk through the same table and hook with a verdict before this chain sees it: where
	// hooks are shared built-in chains (iptables), this chain's jump must stand ahead of every rule
	// jumping to one of them. Every other foreign rule may stand before it (another agent's own
	// jump, inserted first), and is never a reason to move ours. Only for a chain with a Hook;
	// nftables orders its base chains by priority instead and has no use for it.
	Precedes []string
}

// MapEntry maps a destination (address, protocol, port) to a new destination.
type MapEntry struct {
	Addr     netip.Addr
	Protocol Protocol
	Port     uint16
	To       netip.AddrPort
	// Comment names the object the entry comes from (iptables shows it on the expanded rule).
	Comment string
}

// Key identifies the entry within its map.
func (e MapEntry) Key() string {
	return fmt.Sprintf("%s/%s/%d", e.Addr, e.Protocol, e.Port)
}

// Map is a lookup table used by Match.Lookup and DNATLookup. The nftables backend renders it as a
// kernel map (one lookup per packet); the iptables backend expands it into one rule per entry.
type Map struct {
	Name    string
	Entries []MapEntry
}

// Ruleset is everything one fix wants for one family.
type Ruleset struct {
	Fix    string
	Family Family
	Chains []Chain
	Maps   []Map
	// Revision identifies this content for the (fix, family): the engine gives every computation
	// of a fix's rules a new one, so a backend knows a ruleset it reconciled before without
	// comparing it. 0: none (compared by content). Fixes leave it unset.
	Revision uint64
}

// RuleCount is the number of kernel rules the ruleset stands for, counting each map entry once.
func (rs *Ruleset) RuleCount() int {
	n := 0
	for _, c := range rs.Chains {
		n += len(c.Rules)
	}
	for _, m := range rs.Maps {
		n += len(m.Entries)
	}
	return n
}

// Chain returns the chain with that name, or nil.
func (rs *Ruleset) Chain(name string) *Chain {
	for i := range rs.Chains {
		if rs.Chains[i].Name == name {
			return &rs.Chains[i]
		}
	}
	return nil
}

// Map returns the map with that name, or nil.
func (rs *Ruleset) Map(name string) *Map {
	for i := range rs.Maps {
		if rs.Maps[i].Name == name {
			return &rs.Maps[i]
		}
	}
	return nil
}

var (
	fixIDPattern     = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)
	chainNamePattern = regexp.MustCompile(`^[A-Z][A-Z0-9]*(-[A-Z0-9]+)*$`)
	mapNamePattern   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	// foreignChainPattern is a chain name another agent may use: printable, no space or quote,
	// within the kernel's 28 characters.
	foreignChainPattern = regexp.MustCompile(`^[A-Za-z0-9_.:+-]{1,28}$`)
)

// MaxChainName keeps "NNM-" + name within iptables' 28-character chain names.
const MaxChainName = 24

// ValidFixID reports whether id is a short kebab-case word, as fix ids must be.
func ValidFixID(id string) bool { return fixIDPattern.MatchString(id) }

// DNATs reports whether a rule of rs translates by a lookup of map name (a DNATLookup on the
// packet's destination): the connections a LookupCTOriginal of that map finds.
func (rs *Ruleset) DNATs(name string) bool {
	return rs.anyRule(func(r Rule) bool {
		return r.Verdict.Kind == DNATLookup && r.Match.Lookup == name && r.Match.LookupKey == LookupPacket
	})
}

// FindsOriginal reports whether a rule of rs looks map name up by the connection's original
// destination (LookupCTOriginal): whether the connections its DNATLookups translate are looked for.
func (rs *Ruleset) FindsOriginal(name string) bool {
	return rs.anyRule(func(r Rule) bool { return r.Match.LookupKey == LookupCTOriginal && r.Match.Lookup == name })
}

// anyRule reports whether a rule of rs, in any chain, satisfies f.
func (rs *Ruleset) anyRule(f func(Rule) bool) bool {
	for _, c := range rs.Chains {
		if slices.ContainsFunc(c.Rules, f) {
			return true
		}
	}
	return false
}

// Validate checks that the ruleset is well formed: names, jump targets, lookups, families of
// addresses, hooks fit chain types. Backends call it before rendering; fakes call it too.
func (rs *Ruleset) Validate() error {
	if !ValidFixID(rs.Fix) {
		return fmt.Errorf("fix id %q is not kebab-case", rs.Fix)
	}
	if rs.Family != IPv4 && rs.Family != IPv6 {
		return fmt.Errorf("unknown family %q", rs.Family)
	}
	chains := map[string]bool{}
	for _, c := range rs.Chains {
		if !chainNamePattern.MatchString(c.Name) || len(c.Name) > MaxChainName {
			return fmt.Errorf("chain name %q must be upper-case words joined by '-' and at most %d characters", c.Name, MaxChainName)
		}
		if chains[c.Name] {
			return fmt.Errorf("chain %s declared twice", c.Name)
		}
		chains[c.Name] = true
		if c.Type != Filter && c.Type != NAT && c.Type != Mangle {
			return fmt.Errorf("chain %s has unknown type %q", c.Name, c.Type)
		}
		if c.Hook != "" {
			if _, err := ParseHook(string(c.Hook)); err != nil {
				return fmt.Errorf("chain %s: %w", c.Name, err)
			}
			if c.Type == NAT && c.Hook == Forward {
				return fmt.Errorf("chain %s: nat chains cannot hook forward", c.Name)
			}
		}
		for _, f := range c.Precedes {
			switch {
			case c.Hook == "":
				return fmt.Errorf("chain %s: Precedes %q without a Hook (only a hooked chain has a position among others)", c.Name, f)
			case !foreignChainPattern.MatchString(f):
				return fmt.Errorf("chain %s: Precedes %q is no chain name (1-28 characters, no spaces or quotes)", c.Name, f)
			}
		}
	}
	maps := map[string]*Map{}
	for i := range rs.Maps {
		m := &rs.Maps[i]
		if !mapNamePattern.MatchString(m.Name) {
			return fmt.Errorf("map name %q must be lower-case", m.Name)
		}
		if maps[m.Name] != nil {
			return fmt.Errorf("map %s declared twice", m.Name)
		}
		maps[m.Name] = m
		if err := rs.validateEntries(m); err != nil {
			return err
		}
	}
	counters := map[string]bool{}
	for _, c := range rs.Chains {
		for i, r := range c.Rules {
			where := fmt.Sprintf("chain %s rule %d", c.Name, i+1)
			if err := rs.validateRule(c, r, chains, maps); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			if r.Match.LookupKey == LookupCTOriginal && !rs.DNATs(r.Match.Lookup) {
				return fmt.Errorf("%s: a %s lookup of map %q, but no %s rule translates by it (the lookup finds the connections one did)", where, LookupCTOriginal, r.Match.Lookup, DNATLookup)
			}
			if r.Counter != "" {
				if counters[r.Counter] {
					return fmt.Errorf("%s: counter %q used twice", where, r.Counter)
				}
				counters[r.Counter] = true
			}
		}
	}
	return nil
}

// validateEntries checks the entries of m. Duplicate keys are found in the sorted entries, without
// allocating when they are sorted already: at 10,000 entries this runs on every reconcile.
func (rs *Ruleset) validateEntries(m *Map) error {
	for i := range m.Entries {
		e := &m.Entries[i]
		if !rs.Family.Contains(e.Addr) || !rs.Family.Contains(e.To.Addr()) {
			return fmt.Errorf("map %s entry %s -> %s is not %s", m.Name, e.Key(), e.To, rs.Family)
		}
		switch e.Protocol {
		case TCP, UDP, SCTP:
		default:
			return fmt.Errorf("map %s entry %s needs a protocol and a port", m.Name, e.Key())
		}
		if e.Port == 0 {
			return fmt.Errorf("map %s entry %s needs a protocol and a port", m.Name, e.Key())
		}
		if len(e.Comment) > MaxComment {
			return fmt.Errorf("map %s entry %s: comment longer than %d bytes", m.Name, e.Key(), MaxComment)
		}
	}
	sorted := m.Sorted()
	for i := 1; i < len(sorted); i++ {
		if CompareEntries(&sorted[i-1], &sorted[i]) == 0 {
			return fmt.Errorf("map %s has entry %s twice", m.Name, sorted[i].Key())
		}
	}
	return nil
}

func (rs *Ruleset) validateRule(c Chain, r Rule, chains map[string]bool, maps map[string]*Map) error {
	if err := rs.validateMatch(c, r.Match); err != nil {
		return err
	}
	if err := validateLookup(r, maps); err != nil {
		return err
	}
	if len(r.Comment) > MaxComment {
		return fmt.Errorf("comment longer than %d bytes", MaxComment)
	}
	if r.SetMark != 0 && r.ClearMark != 0 {
		return fmt.Errorf("a rule that both sets and clears mark bits (0x%x, 0x%x): use one rule for each", r.SetMark, r.ClearMark)
	}
	return rs.validateVerdict(c, r, chains)
}

// validateMatch checks what a rule matches on the packet: addresses of the family, interfaces,
// protocol, ports and TCP flags.
func (rs *Ruleset) validateMatch(c Chain, m Match) error {
	for _, p := range m.SrcPrefixes {
		if !p.IsValid() || !rs.Family.Contains(p.Addr()) || p.Addr().Is4In6() {
			return fmt.Errorf("source prefix %s is not %s", p, rs.Family)
		}
	}
	for _, p := range m.DstPrefixes {
		if !p.IsValid() || !rs.Family.Contains(p.Addr()) || p.Addr().Is4In6() {
			return fmt.Errorf("destination prefix %s is not %s", p, rs.Family)
		}
	}
	for _, ifp := range []string{m.InInterfacePrefix, m.OutInterfacePrefix} {
		if ifp != "" {
			if err := ValidInterfacePrefix(ifp); err != nil {
				return err
			}
		}
	}
	if m.DstAddr.IsValid() && !rs.Family.Contains(m.DstAddr) {
		return fmt.Errorf("destination %s is not %s", m.DstAddr, rs.Family)
	}
	if m.DstAddr.IsValid() && len(m.DstPrefixes) > 0 {
		return fmt.Errorf("a destination address and destination prefixes in one rule")
	}
	if m.OutInterfacePrefix != "" && (c.Hook == Prerouting || c.Hook == Input) {
		return fmt.Errorf("an output interface match in a %s chain", c.Hook)
	}
	if m.TCPFlags != (TCPFlags{}) {
		if m.Protocol != TCP {
			return fmt.Errorf("a TCP flags match needs protocol tcp")
		}
		if m.TCPFlags.Mask == 0 || m.TCPFlags.Set&^m.TCPFlags.Mask != 0 || m.TCPFlags.Mask&^(FIN|SYN|RST|PSH|ACK|URG) != 0 {
			return fmt.Errorf("TCP flags %v/%v: the set flags must be a subset of a non-empty mask", m.TCPFlags.Set.Names(), m.TCPFlags.Mask.Names())
		}
	}
	if m.Protocol != "" {
		if _, err := ParseProtocol(string(m.Protocol)); err != nil {
			return err
		}
	}
	if m.DstPort != 0 && m.Protocol == "" {
		return fmt.Errorf("a destination port needs a protocol")
	}
	return nil
}

// validateLookup checks a rule's map lookup: the map exists and the key fits the verdict.
func validateLookup(r Rule, maps map[string]*Map) error {
	m := r.Match
	if m.Lookup != "" && maps[m.Lookup] == nil {
		return fmt.Errorf("lookup in missing map %q", m.Lookup)
	}
	switch m.LookupKey {
	case LookupPacket:
	case LookupCTOriginal:
		if m.Lookup == "" {
			return fmt.Errorf("lookup key %s without a Lookup", m.LookupKey)
		}
		if m.DstAddr.IsValid() || len(m.DstPrefixes) > 0 || m.Protocol != "" || m.DstPort != 0 {
			return fmt.Errorf("a %s lookup with a match on the packet's destination or protocol (the lookup is on the original destination)", m.LookupKey)
		}
		if r.Verdict.Kind == DNATLookup {
			return fmt.Errorf("dnat-lookup needs the packet's destination as the lookup key, not %s", m.LookupKey)
		}
	default:
		return fmt.Errorf("unknown lookup key %q", m.LookupKey)
	}
	switch m.CTStatus {
	case "", CTDNAT:
	default:
		return fmt.Errorf("unknown conntrack status %q", m.CTStatus)
	}
	return nil
}

// validateVerdict checks a rule's verdict against its chain: jumps to existing chains, NAT
// verdicts in NAT chains, targets of the family.
func (rs *Ruleset) validateVerdict(c Chain, r Rule, chains map[string]bool) error {
	m := r.Match
	switch r.Verdict.Kind {
	case Continue, Accept, Drop, Return:
	case Jump:
		if !chains[r.Verdict.Chain] {
			return fmt.Errorf("jump to missing chain %q", r.Verdict.Chain)
		}
		if r.Verdict.Chain == c.Name {
			return fmt.Errorf("chain jumps to itself")
		}
	case DNAT:
		if c.Type != NAT {
			return fmt.Errorf("dnat in a %s chain", c.Type)
		}
		if !r.Verdict.To.Addr().IsValid() || !rs.Family.Contains(r.Verdict.To.Addr()) {
			return fmt.Errorf("dnat target %s is not %s", r.Verdict.To, rs.Family)
		}
	case DNATLookup:
		if c.Type != NAT {
			return fmt.Errorf("dnat in a %s chain", c.Type)
		}
		if m.Lookup == "" {
			return fmt.Errorf("dnat-lookup needs Match.Lookup")
		}
	case Masquerade:
		if c.Type != NAT || (c.Hook != "" && c.Hook != Postrouting) {
			return fmt.Errorf("masquerade outside a nat postrouting chain")
		}
	case ClampMSS:
		if c.Type == NAT {
			return fmt.Errorf("clamp-mss in a nat chain (it sees only the first packet of a connection, not the SYN-ACK)")
		}
		if m.Protocol != TCP || m.TCPFlags.Mask&SYN == 0 || m.TCPFlags.Set&SYN == 0 {
			return fmt.Errorf("clamp-mss needs a match on protocol tcp with the SYN flag set")
		}
		if r.Verdict.MSS == 0 && !ClampsToPMTUFrom(c.Hook) {
			return fmt.Errorf("clamp-mss to the path MTU from hook %s (only forward, output and postrouting have a route)", c.Hook)
		}
	default:
		return fmt.Errorf("unknown verdict %q", r.Verdict.Kind)
	}
	return nil
}

// ClampsToPMTUFrom reports whether a path-MTU ClampMSS can run from hook h ("" for a regular chain,
// which is checked where it is jumped to): only hooks that run after the routing decision.
func ClampsToPMTUFrom(h Hook) bool {
	return h == "" || h == Forward || h == Output || h == Postrouting
}

// SameExceptEntries reports whether rs and o differ at most in the entries of their maps.
func (rs *Ruleset) SameExceptEntries(o *Ruleset) bool {
	if rs.Fix != o.Fix || rs.Family != o.Family || len(rs.Maps) != len(o.Maps) || !reflect.DeepEqual(rs.Chains, o.Chains) {
		return false
	}
	for i := range rs.Maps {
		if rs.Maps[i].Name != o.Maps[i].Name {
			return false
		}
	}
	return true
}

// Clone returns a copy of rs that shares nothing with it that a caller could change, except the
// backing arrays of map entries: a caller may set a map's Entries to another slice, but never
// modifies the entries of a slice it has handed over (fix.ServiceMap never does). Backends keep
// the clone of what they reconciled, which costs the chains and no entry.
func (rs *Ruleset) Clone() *Ruleset {
	out := *rs
	out.Chains = slices.Clone(rs.Chains)
	for i := range out.Chains {
		c := &out.Chains[i]
		c.Rules = slices.Clone(c.Rules)
		c.Precedes = slices.Clone(c.Precedes)
		for j := range c.Rules {
			m := &c.Rules[j].Match
			m.SrcPrefixes = slices.Clone(m.SrcPrefixes)
			m.DstPrefixes = slices.Clone(m.DstPrefixes)
			m.CTStates = slices.Clone(m.CTStates)
		}
	}
	out.Maps = slices.Clone(rs.Maps)
	return &out
}

// Equal reports whether rs and o are the same ruleset (Revision aside). It costs a walk of the
// entries: a caller that knows nothing changed says so with Revision.
func (rs *Ruleset) Equal(o *Ruleset) bool {
	if !rs.SameExceptEntries(o) {
		return false
	}
	for i := range rs.Maps {
		if !slices.Equal(rs.Maps[i].Entries, o.Maps[i].Entries) {
			return false
		}
	}
	return true
}

// CompareEntries orders map entries by their key (address, protocol, port): the order in which
// backends render them and fix.ServiceMap keeps them.
func CompareEntries(a, b *MapEntry) int {
	return cmp.Or(a.Addr.Compare(b.Addr), strings.Compare(string(a.Protocol), string(b.Protocol)), cmp.Compare(a.Port, b.Port))
}

func compareEntryValues(a, b MapEntry) int { return CompareEntries(&a, &b) }

// DiffEntries walks two entry lists sorted by key (CompareEntries, as Sorted returns them) in step:
// gone is called for each entry only in old, added for each only in now, and changed for each key
// in both whose entry differs (its target or comment), in key order.
func DiffEntries(old, now []MapEntry, gone, added func(MapEntry), changed func(was, is MapEntry)) {
	for len(old) > 0 || len(now) > 0 {
		var c int
		switch {
		case len(old) == 0:
			c = 1
		case len(now) == 0:
			c = -1
		default:
			c = CompareEntries(&old[0], &now[0])
		}
		switch {
		case c < 0:
			gone(old[0])
			old = old[1:]
		case c > 0:
			added(now[0])
			now = now[1:]
		default:
			if old[0] != now[0] {
				changed(old[0], now[0])
			}
			old, now = old[1:], now[1:]
		}
	}
}

// Sorted returns the map entries sorted by key (CompareEntries), the order in which backends render
// them. Entries that are sorted already (fix.ServiceMap keeps them so) are returned as they are,
// without a copy: the result must not be modified.
func (m *Map) Sorted() []MapEntry {
	if slices.IsSortedFunc(m.Entries, compareEntryValues) {
		return m.Entries
	}
	out := slices.Clone(m.Entries)
	slices.SortFunc(out, compareEntryValues)
	return out
}
