package testkit

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

var hookOrder = map[rules.Hook]int{
	rules.Prerouting: 1, rules.Input: 2, rules.Forward: 3, rules.Output: 4, rules.Postrouting: 5,
	"": 9, // regular chains last
}

// Format returns a readable, deterministic text form of rs, the form golden files hold:
//
//	ruleset <fix> <family>
//	chain <NAME> (<type>, hook <hook>|regular)
//	  <match> [set-mark 0x..] -> <verdict> [counter=<name>] [# comment]
//	map <name>
//	  <addr> <proto> <port> -> <to> [# comment]
//
// Chains are ordered by hook (prerouting, input, forward, output, postrouting, then regular chains)
// and name; rules keep their order; map entries are sorted by key. A nil ruleset formats as "<nil>".
func Format(rs *rules.Ruleset) string {
	if rs == nil {
		return "<nil>\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ruleset %s %s\n", rs.Fix, rs.Family)
	chains := slices.Clone(rs.Chains)
	slices.SortStableFunc(chains, func(a, c rules.Chain) int {
		return cmp.Or(cmp.Compare(hookOrder[a.Hook], hookOrder[c.Hook]), strings.Compare(a.Name, c.Name))
	})
	for _, c := range chains {
		where := "regular"
		if c.Hook != "" {
			where = "hook " + string(c.Hook)
		}
		fmt.Fprintf(&b, "chain %s (%s, %s)\n", c.Name, c.Type, where)
		if len(c.Rules) == 0 {
			b.WriteString("  (no rules)\n")
		}
		for _, r := range c.Rules {
			b.WriteString("  " + FormatRule(r) + "\n")
		}
	}
	maps := slices.Clone(rs.Maps)
	slices.SortStableFunc(maps, func(a, c rules.Map) int { return strings.Compare(a.Name, c.Name) })
	for _, m := range maps {
		fmt.Fprintf(&b, "map %s (%d entries)\n", m.Name, len(m.Entries))
		for _, e := range m.Sorted() {
			line := fmt.Sprintf("  %s %s %d -> %s", e.Addr, e.Protocol, e.Port, e.To)
			if e.Comment != "" {
				line += "  # " + e.Comment
			}
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// FormatRule is one rule in Format's notation.
func FormatRule(r rules.Rule) string {
	var parts []string
	m := r.Match
	if m.InInterfacePrefix != "" {
		parts = append(parts, "iif "+m.InInterfacePrefix+"*")
	}
	if m.OutInterfacePrefix != "" {
		parts = append(parts, "oif "+m.OutInterfacePrefix+"*")
	}
	if len(m.SrcPrefixes) > 0 {
		parts = append(parts, "src "+braced(m.SrcPrefixes, netip.Prefix.String))
	}
	if m.SrcAddrType != "" {
		parts = append(parts, "src-type "+string(m.SrcAddrType))
	}
	if m.DstAddr.IsValid() {
		parts = append(parts, "dst "+m.DstAddr.String())
	}
	if len(m.DstPrefixes) > 0 {
		parts = append(parts, "dst "+braced(m.DstPrefixes, netip.Prefix.String))
	}
	if m.Protocol != "" {
		parts = append(parts, "proto "+string(m.Protocol))
	}
	if m.DstPort != 0 {
		parts = append(parts, fmt.Sprintf("dport %d", m.DstPort))
	}
	if m.TCPFlags.Mask != 0 {
		parts = append(parts, "tcp-flags "+flagList(m.TCPFlags.Set)+"/"+flagList(m.TCPFlags.Mask))
	}
	if len(m.CTStates) > 0 {
		parts = append(parts, "ct state "+braced(m.CTStates, func(s rules.CTState) string { return string(s) }))
	}
	if m.CTStatus != "" {
		parts = append(parts, "ct status "+string(m.CTStatus))
	}
	if m.Mark != 0 {
		parts = append(parts, fmt.Sprintf("mark 0x%08x", m.Mark))
	}
	if m.Lookup != "" {
		if m.LookupKey != rules.LookupPacket {
			parts = append(parts, "lookup "+string(m.LookupKey)+" @"+m.Lookup)
		} else {
			parts = append(parts, "lookup @"+m.Lookup)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "all")
	}
	if r.SetMark != 0 {
		parts = append(parts, fmt.Sprintf("set-mark 0x%08x", r.SetMark))
	}
	if r.ClearMark != 0 {
		parts = append(parts, fmt.Sprintf("clear-mark 0x%08x", r.ClearMark))
	}
	parts = append(parts, "->", formatVerdict(r.Verdict, m.Lookup))
	if r.Counter != "" {
		parts = append(parts, "counter="+r.Counter)
	}
	s := strings.Join(parts, " ")
	if r.Comment != "" {
		s += "  # " + r.Comment
	}
	return s
}

func formatVerdict(v rules.Verdict, lookup string) string {
	switch v.Kind {
	case rules.Continue:
		return "continue"
	case rules.Jump:
		return "jump " + v.Chain
	case rules.DNAT:
		if v.To.Port() == 0 {
			return "dnat to " + v.To.Addr().String()
		}
		return "dnat to " + v.To.String()
	case rules.DNATLookup:
		return "dnat to @" + lookup
	case rules.ClampMSS:
		if v.MSS == 0 {
			return "clamp-mss to pmtu"
		}
		return fmt.Sprintf("clamp-mss to %d", v.MSS)
	default:
		return string(v.Kind)
	}
}

// braced is xs, each formatted by str, in set notation: {a, b}.
func braced[T any](xs []T, str func(T) string) string {
	ss := make([]string, len(xs))
	for i, x := range xs {
		ss[i] = str(x)
	}
	return "{" + strings.Join(ss, ", ") + "}"
}

// flagList is "syn,ack"-style, or "none" for an empty set.
func flagList(f rules.TCPFlag) string {
	if f == 0 {
		return "none"
	}
	return strings.Join(f.Names(), ",")
}
