package nftables

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/connlabel"
)

// TablePrefix starts the name of every table this backend owns: table <family> nnm-<fix-id>.
const TablePrefix = "nnm-"

// TableName is the nftables table that holds fix's rules (one per family).
func TableName(fix string) string { return TablePrefix + fix }

// CounterPrefix starts the kernel name of every named counter. nft 1.0.x neither accepts keywords
// ("dnat", "drop", ...) as object names nor quoted names, so Rule.Counter "dnat" becomes "cnt-dnat".
const CounterPrefix = "cnt-"

// CounterName is the kernel name of the counter Rule.Counter names.
func CounterName(name string) string { return CounterPrefix + name }

// ChainName is the nftables chain name of a rules.Chain name ("INVALID-INPUT" -> "invalid-input").
func ChainName(name string) string { return strings.ToLower(name) }

// Base-chain priorities. nat prerouting/output run before kube-proxy's dstnat (-100) chains so that
// our DNAT wins; nat postrouting/input run after srcnat (100); filter hooks run just before filter (0).
const (
	PriorityNATDst = -110
	PriorityNATSrc = 110
	PriorityFilter = -10
	// PriorityMangle is just before the mangle priority (-150), for chains of type rules.Mangle.
	PriorityMangle = -160
	keyFieldsFmt   = "%s . inet_proto . inet_service"
	mapValueFmt    = " : %s . inet_service"
	// keySetSuffix ends the name of a map's companion set (see mapModel.keys). Map names are
	// [a-z0-9-] (rules.Map), so no map can be named like a companion.
	keySetSuffix = "_keys"
)

// keySetName is the name of the companion set of map name.
func keySetName(mapName string) string { return mapName + keySetSuffix }

// fam holds everything that differs between IPv4 and IPv6; everything else is one code path.
type fam struct {
	nft      knftables.Family // table family: ip / ip6
	addr     string           // address match keyword: ip / ip6
	addrType string           // set/map type: ipv4_addr / ipv6_addr
}

func familyOf(f rules.Family) (fam, error) {
	switch f {
	case rules.IPv4:
		return fam{nft: knftables.IPv4Family, addr: "ip", addrType: "ipv4_addr"}, nil
	case rules.IPv6:
		return fam{nft: knftables.IPv6Family, addr: "ip6", addrType: "ipv6_addr"}, nil
	}
	return fam{}, fmt.Errorf("nftables backend: unknown family %q", f)
}

// model is a Ruleset translated into knftables objects: what one table must contain.
type model struct {
	family   knftables.Family
	table    string
	chains   []chainModel
	counters []string
	maps     []mapModel
}

// tableObject is m's table with its owner comment (OwnerComment). nftables keeps a table's comment
// from its creation on: `add table` with a comment on an existing table leaves it as it was.
func (m *model) tableObject() *knftables.Table {
	c := OwnerComment(strings.TrimPrefix(m.table, TablePrefix))
	return &knftables.Table{Comment: &c}
}

type chainModel struct {
	chain knftables.Chain
	rules []knftables.Rule
}

// mapModel is a rules.Map: the kernel map that DNATLookup reads, and its companion set of the same
// keys that Match.Lookup tests. Using a map as a set (a lookup with no destination register) is
// refused by kernels before 6.3 ("Invalid argument"; Debian 12's 6.1 among them), so membership is
// tested against the set. Both are written in the same transaction, so they never disagree in the
// kernel.
type mapModel struct {
	m    knftables.Map
	keys knftables.Set
	// entries are the map's entries, sorted by rules.CompareEntries: the ruleset's own slice (shared,
	// never modified), so a model costs no memory per entry, and the elements of the map and the set
	// are rendered only when a transaction carries them.
	entries []rules.MapEntry
}

// sameDefinition reports whether two chains are the same kernel object apart from their rules.
func sameDefinition(a, b knftables.Chain) bool {
	eq := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Name == b.Name && eq((*string)(a.Type), (*string)(b.Type)) && eq((*string)(a.Hook), (*string)(b.Hook)) &&
		eq((*string)(a.Priority), (*string)(b.Priority)) && eq((*string)(a.Policy), (*string)(b.Policy))
}

var (
	counterNamePattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_.-]*$`)
)

// commentText makes s safe as one nft comment, per object, as the iptables backend does. nft's
// quoted strings have no escapes: a double quote ends the string, and knftables writes a newline or a
// non-ASCII byte as a Go escape that the kernel would store literally, so the read-back would differ
// forever. So a double quote becomes a single quote, a backslash a slash, and every byte outside
// printable ASCII a question mark. One odd object name then changes its own comment, not the fate of
// the whole fix.
func commentText(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c == '"':
			b[i] = '\''
		case c == '\\':
			b[i] = '/'
		case c < 0x20 || c > 0x7e:
			b[i] = '?'
		}
	}
	return string(b)
}

// build validates rs and translates it into a model. It does no I/O.
func build(rs *rules.Ruleset) (*model, error) {
	if err := rs.Validate(); err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	f, err := familyOf(rs.Family)
	if err != nil {
		return nil, err
	}
	m := &model{family: f.nft, table: TableName(rs.Fix)}
	for _, c := range rs.Chains {
		cm := chainModel{chain: baseChain(c)}
		for i, r := range c.Rules {
			label, err := connlabel.Of(rs, r)
			if err != nil {
				return nil, fmt.Errorf("nftables backend: chain %s rule %d: %w", c.Name, i+1, err)
			}
			text, err := ruleText(f, c, r, label)
			if err != nil {
				return nil, fmt.Errorf("nftables backend: chain %s rule %d: %w", c.Name, i+1, err)
			}
			kr := knftables.Rule{Chain: cm.chain.Name, Rule: text}
			if r.Comment != "" {
				kr.Comment = knftables.PtrTo(commentText(r.Comment))
			}
			cm.rules = append(cm.rules, kr)
			if r.Counter != "" {
				m.counters = append(m.counters, CounterName(r.Counter))
			}
		}
		m.chains = append(m.chains, cm)
	}
	for i := range rs.Maps {
		rm := &rs.Maps[i]
		keyType := fmt.Sprintf(keyFieldsFmt, f.addrType)
		mm := mapModel{
			m:    knftables.Map{Name: rm.Name, Type: keyType + fmt.Sprintf(mapValueFmt, f.addrType)},
			keys: knftables.Set{Name: keySetName(rm.Name), Type: keyType},
		}
		mm.entries = rm.Sorted()
		m.maps = append(m.maps, mm)
	}
	return m, nil
}

// baseChain is the kernel chain of c without its rules: named ChainName(c.Name), and for a chain
// with a Hook a base chain of its type on that hook, at our priority for the type and hook, policy
// accept.
func baseChain(c rules.Chain) knftables.Chain {
	kc := knftables.Chain{Name: ChainName(c.Name)}
	if c.Hook == "" {
		return kc
	}
	prio := PriorityFilter
	if c.Type == rules.Mangle {
		prio = PriorityMangle
	}
	if c.Type == rules.NAT {
		prio = PriorityNATSrc
		if c.Hook == rules.Prerouting || c.Hook == rules.Output {
			prio = PriorityNATDst
		}
	}
	typ := knftables.FilterType
	if c.Type == rules.NAT {
		typ = knftables.NATType
	}
	kc.Type = knftables.PtrTo(typ)
	kc.Hook = knftables.PtrTo(knftables.BaseChainHook(c.Hook))
	kc.Priority = knftables.PtrTo(knftables.BaseChainPriority(strconv.Itoa(prio)))
	kc.Policy = knftables.PtrTo(knftables.AcceptPolicy)
	return kc
}

func element(mapName string, e rules.MapEntry) knftables.Element {
	to := e.To.Port()
	if to == 0 {
		to = e.Port // the map value needs a port; zero keeps the original one
	}
	el := knftables.Element{
		Map:   mapName,
		Key:   elementKeyFields(e),
		Value: []string{e.To.Addr().Unmap().String(), strconv.Itoa(int(to))},
	}
	if e.Comment != "" {
		el.Comment = knftables.PtrTo(commentText(e.Comment))
	}
	return el
}

// elementKeyFields is the key of e as nft writes it: address . protocol . port.
func elementKeyFields(e rules.MapEntry) []string {
	return []string{e.Addr.Unmap().String(), string(e.Protocol), strconv.Itoa(int(e.Port))}
}

// keyElement is the element of e's key in the companion set named set.
func keyElement(set string, e rules.MapEntry) knftables.Element {
	return knftables.Element{Set: set, Key: elementKeyFields(e)}
}

// elementKey identifies an element within its map or set, as nft does.
func elementKey(e *knftables.Element) string { return strings.Join(e.Key, " . ") }

func addrString(a netip.Addr) string { return a.Unmap().String() }

// ruleText renders the nft expression of one rule (without its comment, which knftables adds).
// label is the rule's conntrack label (connlabel.Of): a lookup by original destination matches it
// instead of looking the key up, and a DNAT by the map sets it.
func ruleText(f fam, c rules.Chain, r rules.Rule, label int) (string, error) {
	var p []string
	m := r.Match
	if m.InInterfacePrefix != "" {
		if err := rules.ValidInterfacePrefix(m.InInterfacePrefix); err != nil {
			return "", err
		}
		p = append(p, fmt.Sprintf("iifname %q", m.InInterfacePrefix+"*"))
	}
	if m.OutInterfacePrefix != "" {
		if err := rules.ValidInterfacePrefix(m.OutInterfacePrefix); err != nil {
			return "", err
		}
		p = append(p, fmt.Sprintf("oifname %q", m.OutInterfacePrefix+"*"))
	}
	if len(m.SrcPrefixes) > 0 {
		p = append(p, f.addr+" saddr "+prefixSet(m.SrcPrefixes))
	}
	switch m.SrcAddrType {
	case "":
	case rules.Local:
		p = append(p, "fib saddr type local")
	default:
		return "", fmt.Errorf("unsupported source address type %q", m.SrcAddrType)
	}
	if m.DstAddr.IsValid() {
		p = append(p, f.addr+" daddr "+addrString(m.DstAddr))
	}
	if len(m.DstPrefixes) > 0 {
		p = append(p, f.addr+" daddr "+prefixSet(m.DstPrefixes))
	}
	if m.Protocol != "" {
		if m.DstPort != 0 {
			p = append(p, fmt.Sprintf("%s dport %d", m.Protocol, m.DstPort))
		} else {
			p = append(p, "meta l4proto "+string(m.Protocol))
		}
	}
	if fl := m.TCPFlags; fl.Mask != 0 {
		p = append(p, fmt.Sprintf("tcp flags & (%s) == %s", strings.Join(fl.Mask.Names(), " | "), nftFlags(fl.Set)))
	}
	if len(m.CTStates) > 0 {
		cs := make([]string, len(m.CTStates))
		for i, s := range m.CTStates {
			cs[i] = string(s)
		}
		p = append(p, "ct state "+setOf(cs))
	}
	switch m.CTStatus {
	case "":
	case rules.CTDNAT:
		p = append(p, "ct status dnat")
	default:
		return "", fmt.Errorf("unsupported conntrack status %q", m.CTStatus)
	}
	if m.Mark != 0 {
		p = append(p, fmt.Sprintf("meta mark & 0x%08x == 0x%08x", m.Mark, m.Mark))
	}
	lookupKey := f.addr + " daddr . meta l4proto . th dport"
	if m.Lookup != "" {
		switch m.LookupKey {
		case rules.LookupPacket:
			p = append(p, lookupKey+" @"+keySetName(m.Lookup))
		case rules.LookupCTOriginal:
			// The connections the map's DNAT labelled (internal/connlabel): one compare, where a
			// lookup of the original destination in the key set cost a DNATed connection a hash
			// lookup more (bench/datapath).
			p = append(p, fmt.Sprintf("ct label %d", label))
		default:
			return "", fmt.Errorf("unsupported lookup key %q", m.LookupKey)
		}
	}
	if r.Counter != "" {
		if !counterNamePattern.MatchString(r.Counter) {
			return "", fmt.Errorf("counter name %q must be a letter followed by letters, digits, '_', '.' or '-'", r.Counter)
		}
		p = append(p, fmt.Sprintf("counter name %q", CounterName(r.Counter)))
	}
	if r.SetMark != 0 {
		p = append(p, fmt.Sprintf("meta mark set meta mark | 0x%08x", r.SetMark))
	}
	if r.ClearMark != 0 {
		p = append(p, fmt.Sprintf("meta mark set meta mark & 0x%08x", ^r.ClearMark))
	}
	if label != 0 && r.Verdict.Kind == rules.DNATLookup {
		// Ahead of the dnat, which ends the rule; after the key set's lookup, so only an entry's
		// connections get it.
		p = append(p, fmt.Sprintf("ct label set %d", label))
	}
	p, err := appendVerdict(p, f, m, r.Verdict, lookupKey)
	if err != nil {
		return "", err
	}
	if len(p) == 0 {
		return "", fmt.Errorf("rule has neither a match, a counter, a mark nor a verdict")
	}
	return strings.Join(p, " "), nil
}

// appendVerdict appends the statement of a rule's verdict; lookupKey is the key of its map lookup.
func appendVerdict(p []string, f fam, m rules.Match, v rules.Verdict, lookupKey string) ([]string, error) {
	switch v.Kind {
	case rules.Continue:
	case rules.Accept, rules.Drop, rules.Return, rules.Masquerade:
		p = append(p, string(v.Kind))
	case rules.Jump:
		p = append(p, "jump "+ChainName(v.Chain))
	case rules.DNAT:
		a := addrString(v.To.Addr())
		switch {
		case v.To.Port() == 0:
			p = append(p, "dnat to "+a)
		case m.Protocol == "":
			// nft: "transport protocol mapping is only valid after transport protocol match"
			return nil, fmt.Errorf("dnat to %s needs Match.Protocol to rewrite the port", v.To)
		case f.nft == knftables.IPv6Family:
			p = append(p, fmt.Sprintf("dnat to [%s]:%d", a, v.To.Port()))
		default:
			p = append(p, fmt.Sprintf("dnat to %s:%d", a, v.To.Port()))
		}
	case rules.DNATLookup:
		p = append(p, "dnat to "+lookupKey+" map @"+m.Lookup)
	case rules.ClampMSS:
		// The kernel never raises the MSS with this statement (nft_exthdr), like iptables' TCPMSS.
		if v.MSS == 0 {
			p = append(p, "tcp option maxseg size set rt mtu")
		} else {
			p = append(p, fmt.Sprintf("tcp option maxseg size set %d", v.MSS))
		}
	default:
		return nil, fmt.Errorf("unsupported verdict %q", v.Kind)
	}
	return p, nil
}

// prefixSet renders prefixes (IPv4-mapped ones as IPv4) as one value or an anonymous set.
func prefixSet(prefixes []netip.Prefix) string {
	ps := make([]string, len(prefixes))
	for i, pfx := range prefixes {
		pfx = pfx.Masked()
		ps[i] = netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-boolInt(pfx.Addr().Is4In6())*96).String()
	}
	return setOf(ps)
}

// nftFlags is a flag set in nft notation ("syn", "syn | ack"; "0x0" when empty).
func nftFlags(f rules.TCPFlag) string {
	if f == 0 {
		return "0x0"
	}
	return strings.Join(f.Names(), " | ")
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setOf renders one value as itself and several as an anonymous set.
func setOf(vals []string) string {
	if len(vals) == 1 {
		return vals[0]
	}
	return "{ " + strings.Join(vals, ", ") + " }"
}

// existing describes what the kernel holds in our table before a full rewrite.
type existing struct {
	chains, maps, sets, counters []string
	// trusted: the chains and maps have the definitions of known (our last successful apply, and the
	// kernel still matches it). Otherwise every existing chain and map is deleted and re-created, since
	// a base chain's hook or priority cannot be changed in place.
	trusted bool
	known   *model
}

// writeFull queues the transaction that makes the table hold exactly m. With ex == nil (nothing of
// ours in the kernel) and !loaded it is exactly what Render shows; loaded says that loadMaps has
// just created the (new) table's maps and sets with their elements.
func writeFull(tx *knftables.Transaction, m *model, ex *existing, loaded bool) {
	tx.Add(m.tableObject())
	desiredChains := map[string]*knftables.Chain{}
	for i := range m.chains {
		desiredChains[m.chains[i].chain.Name] = &m.chains[i].chain
	}
	desiredMaps := map[string]bool{}
	desiredSets := map[string]bool{}
	for _, mm := range m.maps {
		desiredMaps[mm.m.Name] = true
		desiredSets[mm.keys.Name] = true
	}
	desiredCounters := map[string]bool{}
	for _, c := range m.counters {
		desiredCounters[c] = true
	}
	if ex != nil {
		// Empty every chain first so no rule references a chain, map or counter we delete below.
		for _, name := range ex.chains {
			tx.Flush(&knftables.Chain{Name: name})
		}
		knownChains := map[string]knftables.Chain{}
		if ex.trusted && ex.known != nil {
			for _, c := range ex.known.chains {
				knownChains[c.chain.Name] = c.chain
			}
		}
		for _, name := range ex.chains {
			want, keep := desiredChains[name]
			if known, ok := knownChains[name]; keep && ok && sameDefinition(known, *want) {
				continue
			}
			tx.Delete(&knftables.Chain{Name: name})
		}
		for _, name := range ex.maps {
			if !desiredMaps[name] || !ex.trusted {
				tx.Delete(&knftables.Map{Name: name})
			}
		}
		for _, name := range ex.sets {
			if !desiredSets[name] || !ex.trusted {
				tx.Delete(&knftables.Set{Name: name})
			}
		}
	}
	for i := range m.chains {
		c := m.chains[i].chain
		tx.Add(&c)
		tx.Flush(&knftables.Chain{Name: c.Name})
	}
	for _, name := range m.counters {
		tx.Add(&knftables.Counter{Name: name})
	}
	for i := range m.maps {
		entries := m.maps[i].entries
		// fill adds the map or the set, then (unless loadMaps has just created and filled it, in a
		// new table: adding it again is a no-op) empties it and adds its elements.
		fill := func(obj knftables.Object, elem func(rules.MapEntry) knftables.Element) {
			tx.Add(obj)
			if loaded {
				return
			}
			tx.Flush(obj)
			for _, e := range entries {
				el := elem(e)
				tx.Add(&el)
			}
		}
		mm, ks := m.maps[i].m, m.maps[i].keys
		fill(&mm, func(e rules.MapEntry) knftables.Element { return element(mm.Name, e) })
		fill(&ks, func(e rules.MapEntry) knftables.Element { return keyElement(ks.Name, e) })
	}

	for i := range m.chains {
		for j := range m.chains[i].rules {
			r := m.chains[i].rules[j]
			tx.Add(&r)
		}
	}
	if ex != nil {
		for _, name := range ex.counters {
			if !desiredCounters[name] {
				tx.Delete(&knftables.Counter{Name: name})
			}
		}
	}
}

// sameShape reports whether a and b differ at most in map elements.
func sameShape(a, b *model) bool {
	if a.family != b.family || a.table != b.table || len(a.chains) != len(b.chains) ||
		len(a.maps) != len(b.maps) || strings.Join(a.counters, "\x00") != strings.Join(b.counters, "\x00") {
		return false
	}
	for i := range a.chains {
		ca, cb := a.chains[i], b.chains[i]
		if !sameDefinition(ca.chain, cb.chain) || len(ca.rules) != len(cb.rules) {
			return false
		}
		for j := range ca.rules {
			ra, rb := ca.rules[j], cb.rules[j]
			if ra.Rule != rb.Rule || (ra.Comment == nil) != (rb.Comment == nil) || (ra.Comment != nil && *ra.Comment != *rb.Comment) {
				return false
			}
		}
	}
	for i := range a.maps {
		if a.maps[i].m.Name != b.maps[i].m.Name || a.maps[i].m.Type != b.maps[i].m.Type ||
			a.maps[i].keys.Name != b.maps[i].keys.Name || a.maps[i].keys.Type != b.maps[i].keys.Type {
			return false
		}
	}
	return true
}

// writeElementDiff queues only the element operations that turn old's maps and their companion sets
// into m's (same shape), walking both sorted entry lists side by side: the cost is one comparison
// per entry, and elements are rendered only for the entries that differ. A changed entry (same key,
// other value or comment) is deleted from the map and re-added, since nft refuses to add a key that
// exists with other data; its key stays in the set. It reports whether anything was queued.
func writeElementDiff(tx *knftables.Transaction, old, m *model) bool {
	changed := false
	for i := range m.maps {
		name, set := m.maps[i].m.Name, m.maps[i].keys.Name
		diffElements(old, m, i, func(e rules.MapEntry, withKey, add bool) {
			el := element(name, e)
			switch {
			case add:
				tx.Add(&el)
				if withKey {
					tx.Add(&knftables.Element{Set: set, Key: el.Key})
				}
			default:
				tx.Delete(&knftables.Element{Map: name, Key: el.Key})
				if withKey {
					tx.Delete(&knftables.Element{Set: set, Key: el.Key})
				}
			}
			changed = true
		})
	}
	return changed
}

// diffElements calls op for each element operation that turns old's map i into m's, walking both
// sorted entry lists side by side: an entry gone is deleted, a new one added, each with its key in
// the companion set (withKey); a changed entry (same key, other data or comment) is deleted from
// the map and added again, since nft refuses to add a key that exists with other data, and its key
// stays in the set.
func diffElements(old, m *model, i int, op func(e rules.MapEntry, withKey, add bool)) {
	rules.DiffEntries(old.maps[i].entries, m.maps[i].entries,
		func(e rules.MapEntry) { op(e, true, false) },
		func(e rules.MapEntry) { op(e, true, true) },
		func(was, is rules.MapEntry) { op(was, false, false); op(is, false, true) })
}
