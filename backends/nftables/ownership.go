package nftables

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Whose a table is (issue #63). Every table this backend makes carries its owner comment
// (OwnerComment) from its creation. An agent built before the comment existed (before 2026-12-03)
// made its tables without any comment; such a table is an earlier version's, and ours, when nothing
// in it is anything this backend does not make (earlierVersion): then the apply path adopts it
// (rewrites it with the owner comment, in one transaction, and logs that) and cleanup removes it.
// Any other table named like ours is someone else's: an apply of the fix it is named after fails
// with a backend.ForeignError naming it, and nothing (apply, remove, cleanup) lists its objects for
// change, flushes, rewrites or deletes it. One judgement (judge) serves all of them, so that
// `cleanup --dry-run`, `cleanup` and the apply path agree.

// owner is whose a table is.
type owner int

const (
	noTable      owner = iota // no such table
	ownTable                  // it carries our owner comment
	earlierTable              // an earlier version of this backend made it: no comment, nothing foreign in it
	foreignTable              // someone else's
)

// TableShape is what an ownership judgement reads of a table without a comment
// (Options.DescribeTable): its chains with their definitions, and the names of its other objects.
type TableShape struct {
	// Chains: each chain's name and, for a base chain, its type, hook, priority and policy.
	Chains []knftables.Chain
	// Maps, Sets (not the anonymous sets nft makes for a rule) and Counters by name.
	Maps, Sets, Counters []string
	// Others names the objects of any other kind ("flowtable ft", "object q (type 2)"): this
	// backend makes none.
	Others []string
}

// judge says whose table t (of family) is; for a table that is not ours, why says what shows it.
// Only a table named like ours without our comment is described (one netlink dump).
func (b *Ops) judge(ctx context.Context, family knftables.Family, t TableInfo) (o owner, why string, err error) {
	fix, named := strings.CutPrefix(t.Name, TablePrefix)
	switch {
	case !named || !rules.ValidFixID(fix):
		return foreignTable, "its name is not nnm-<fix>", nil
	case ours(t):
		return ownTable, "", nil
	case t.Comment != "":
		return foreignTable, fmt.Sprintf("its comment is %s, not %q", shownComment(t.Comment), OwnerComment(fix)), nil
	}
	shape, err := b.opts.DescribeTable(ctx, family, t.Name)
	if err != nil {
		return foreignTable, "", fmt.Errorf("nftables backend: read table %s %s to tell whose it is: %w", family, t.Name, err)
	}
	if why := earlierVersion(shape); why != "" {
		return foreignTable, "it has no owner comment and " + why, nil
	}
	return earlierTable, "", nil
}

// shownComment is a foreign comment as an error shows it: quoted, at most 64 bytes of it.
func shownComment(c string) string {
	if len(c) > 64 {
		return strconv.Quote(c[:64]) + "…"
	}
	return strconv.Quote(c)
}

// foreignError is the error of an apply that met someone else's table where the unit's must be.
func foreignError(family knftables.Family, table, why string) error {
	return &backend.ForeignError{Object: fmt.Sprintf("table %s %s", family, table), Why: why}
}

// Names as build makes them: chains ChainName of a rules.Chain name, maps rules.Map names, counters
// CounterName of a Rule.Counter.
var (
	ourChainName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	ourMapName   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
)

// baseChainDefinitions are the definitions build gives a base chain, one for each chain type and hook
// a ruleset may name: the only base chains an earlier version made (the priorities have not changed
// since the backend's first version).
var baseChainDefinitions = func() []knftables.Chain {
	var out []knftables.Chain
	for _, typ := range []rules.ChainType{rules.Filter, rules.NAT, rules.Mangle} {
		for _, hook := range []rules.Hook{rules.Prerouting, rules.Input, rules.Forward, rules.Output, rules.Postrouting} {
			out = append(out, baseChain(rules.Chain{Type: typ, Hook: hook}))
		}
	}
	return out
}()

// earlierVersion says what in shape no version of this backend makes ("" when nothing): a table an
// earlier agent made holds at least one chain; chains named as ChainName names them, base chains
// only as build defines them (policy accept, our hooks' types and priorities); maps named as
// rules.Map names them, sets only the companion key set of a map of the table, counters named by
// CounterName; and no object of another kind.
func earlierVersion(s *TableShape) string {
	if len(s.Chains) == 0 {
		return "holds no chain (an earlier agent's table always had one)"
	}
	for _, c := range s.Chains {
		if !ourChainName.MatchString(c.Name) {
			return fmt.Sprintf("holds chain %q, a name this backend never gives", c.Name)
		}
		if c.Hook == nil && c.Type == nil && c.Priority == nil && c.Policy == nil {
			continue // a regular chain
		}
		if !slices.ContainsFunc(baseChainDefinitions, func(d knftables.Chain) bool { d.Name = c.Name; return sameDefinition(d, c) }) {
			return "holds chain " + c.Name + " hooked as " + describeChain(c) + ", which this backend never makes"
		}
	}
	for _, m := range s.Maps {
		if !ourMapName.MatchString(m) {
			return fmt.Sprintf("holds map %q, a name this backend never gives", m)
		}
	}
	for _, set := range s.Sets {
		if m, ok := strings.CutSuffix(set, keySetSuffix); !ok || !slices.Contains(s.Maps, m) {
			return fmt.Sprintf("holds set %q, which is no map's key set", set)
		}
	}
	for _, c := range s.Counters {
		if name, ok := strings.CutPrefix(c, CounterPrefix); !ok || !counterNamePattern.MatchString(name) {
			return fmt.Sprintf("holds counter %q, a name this backend never gives", c)
		}
	}
	if len(s.Others) > 0 {
		return "holds " + strings.Join(s.Others, ", ") + ", which this backend never makes"
	}
	return ""
}

// describeChain is a base chain's definition as nft writes it.
func describeChain(c knftables.Chain) string {
	s := func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	}
	return fmt.Sprintf("type %s hook %s priority %s policy %s", s((*string)(c.Type)), s((*string)(c.Hook)), s((*string)(c.Priority)), s((*string)(c.Policy)))
}

// owner says whose k's table is (noTable when there is none; why: see judge), from one listing of
// the family's tables.
func (b *Ops) owner(ctx context.Context, k tableKey) (o owner, why string, err error) {
	tables, err := b.opts.ListTables(ctx, k.family)
	if err != nil {
		if ctx.Err() != nil {
			return noTable, "", ctx.Err()
		}
		return noTable, "", err
	}
	i := slices.IndexFunc(tables, func(t TableInfo) bool { return t.Name == k.table })
	if i < 0 {
		return noTable, "", nil
	}
	return b.judge(ctx, k.family, tables[i])
}

// claim looks at k's table before an apply rewrites it from a listing: nothing to do when it is
// absent or ours; adopt when an earlier version made it (logged: the apply then replaces it with a
// table carrying the owner comment); a backend.ForeignError when it is someone else's.
func (b *Ops) claim(ctx context.Context, k tableKey, step *backend.Step[*applied]) (adopt bool, err error) {
	step.ReadBack = true
	switch o, why, err := b.owner(ctx, k); {
	case err != nil:
		return false, err
	case o == foreignTable:
		return false, foreignError(k.family, k.table, why)
	case o == earlierTable:
		b.log.Warn("adopting a table an earlier version of the agent made (no owner comment, nothing in it that this backend does not make): rewriting it with the owner comment",
			"table", string(k.family)+" "+k.table, "comment", OwnerComment(strings.TrimPrefix(k.table, TablePrefix)))
		return true, nil
	}
	return false, nil
}

// describeRealTable is the default Options.DescribeTable: the table's objects over netlink, in the
// calling thread's network namespace.
func describeRealTable(_ context.Context, family knftables.Family, table string) (*TableShape, error) {
	l := netlinkLister{family: family, table: table}
	conn, t, err := l.open()
	if err != nil {
		return nil, err
	}
	chains, err := l.chains(conn, t)
	if err != nil {
		return nil, err
	}
	sets, err := conn.GetSets(t)
	if err != nil {
		return nil, l.wrap("sets", err)
	}
	objs, err := objectTypes(t)
	if err != nil {
		return nil, l.wrap("named objects", err)
	}
	flowtables, err := conn.ListFlowtables(t)
	if err != nil {
		return nil, l.wrap("flowtables", err)
	}
	s := &TableShape{}
	for _, c := range chains {
		kc := knftables.Chain{Name: c.Name}
		if c.Hooknum != nil {
			kc.Type = knftables.PtrTo(knftables.BaseChainType(c.Type))
			kc.Hook = knftables.PtrTo(hookName(*c.Hooknum))
			if c.Priority != nil {
				kc.Priority = knftables.PtrTo(knftables.BaseChainPriority(strconv.Itoa(int(*c.Priority))))
			}
			policy := knftables.AcceptPolicy
			if c.Policy != nil && *c.Policy == gnft.ChainPolicyDrop {
				policy = knftables.DropPolicy
			}
			kc.Policy = &policy
		}
		s.Chains = append(s.Chains, kc)
	}
	for _, set := range sets {
		switch {
		case set.Anonymous:
		case set.IsMap:
			s.Maps = append(s.Maps, set.Name)
		default:
			s.Sets = append(s.Sets, set.Name)
		}
	}
	for _, o := range objs {
		if o.typ == unix.NFT_OBJECT_COUNTER {
			s.Counters = append(s.Counters, o.name)
		} else {
			s.Others = append(s.Others, fmt.Sprintf("object %s (type %d)", o.name, o.typ))
		}
	}
	for _, f := range flowtables {
		s.Others = append(s.Others, "flowtable "+f.Name)
	}
	return s, nil
}

// hookName is a netfilter hook number as nft names it.
func hookName(h gnft.ChainHook) knftables.BaseChainHook {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return knftables.PreroutingHook
	case unix.NF_INET_LOCAL_IN:
		return knftables.InputHook
	case unix.NF_INET_FORWARD:
		return knftables.ForwardHook
	case unix.NF_INET_LOCAL_OUT:
		return knftables.OutputHook
	case unix.NF_INET_POST_ROUTING:
		return knftables.PostroutingHook
	}
	return knftables.BaseChainHook("hook " + strconv.Itoa(int(h)))
}

// namedObject is a stateful object of a table: its name and NFT_OBJECT_* type.
type namedObject struct {
	name string
	typ  uint32
}

// objectTypes dumps the names and types of table t's stateful objects (counters, quotas, limits, ...)
// over netlink, decoding nothing else: google/nftables decodes each object's data and knows only
// some types, and an ownership judgement must read any table.
func objectTypes(t *gnft.Table) ([]namedObject, error) {
	var out []namedObject
	err := nftDump(unix.NFT_MSG_GETOBJ, byte(t.Family), []netlink.Attribute{{Type: unix.NFTA_OBJ_TABLE, Data: []byte(t.Name + "\x00")}},
		func(ad *netlink.AttributeDecoder) {
			var o namedObject
			table := ""
			for ad.Next() {
				switch ad.Type() {
				case unix.NFTA_OBJ_TABLE:
					table = ad.String()
				case unix.NFTA_OBJ_NAME:
					o.name = ad.String()
				case unix.NFTA_OBJ_TYPE:
					o.typ = ad.Uint32()
				}
			}
			if table == t.Name {
				out = append(out, o)
			}
		})
	return out, err
}
