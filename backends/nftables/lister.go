package nftables

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Lister is what the backend reads one of its tables back with: the listings of knftables.Interface
// it uses. On the real kernel it is netlinkLister; with a fake kernel (Options.NewInterface set and
// Options.NewLister nil) it is the table's knftables interface itself.
type Lister interface {
	ListAll(ctx context.Context) (map[string][]string, error)
	ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error)
	ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error)
	ListCounters(ctx context.Context) ([]*knftables.Counter, error)
}

var _ Lister = knftables.Interface(nil)

// errNoTable is a listing's error when the table does not exist; isNotFound recognises it and
// knftables' own.
var errNoTable = errors.New("no such table")

func isNotFound(err error) bool { return errors.Is(err, errNoTable) || knftables.IsNotFound(err) }

// netlinkLister lists one of our tables over netlink (github.com/google/nftables), in the calling
// thread's network namespace, with the answers knftables' `nft --json` listings give for our
// objects. Why not `nft`: every listing is an nft process, and the backend lists after each
// transaction, on every Verify whose generation moved and on every scrape. In the e2e suite that
// was 1,500 nft runs costing 42 s of CPU; under the VM lane's emulation each costs about a second.
// knftables' own UseNetlink covers List and ListAll only (see realOptions for why it is not used).
//
// A table that does not exist is errNoTable. Nft's anonymous sets (bound to a rule, deleted with it)
// are not listed: they are not objects of ours to flush or compare. Dumps are not retried when the
// kernel flags them interrupted (NLM_F_DUMP_INTR, which google/nftables does not check): a listing
// that raced a change can only differ from the record, and a difference costs a rewrite.
type netlinkLister struct {
	family knftables.Family
	table  string
}

func newNetlinkLister(family knftables.Family, table string) (Lister, error) {
	if _, _, err := netlinkFamily(family); err != nil {
		return nil, err
	}
	return netlinkLister{family: family, table: table}, nil
}

// open connects and looks the table up (errNoTable when absent).
func (l netlinkLister) open() (*gnft.Conn, *gnft.Table, error) {
	tf, _, err := netlinkFamily(l.family)
	if err != nil {
		return nil, nil, err
	}
	conn, err := gnft.New()
	if err != nil {
		return nil, nil, fmt.Errorf("list table %s %s over netlink: %w", l.family, l.table, err)
	}
	t, err := conn.ListTableOfFamily(l.table, tf)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil, fmt.Errorf("table %s %s: %w", l.family, l.table, errNoTable)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list table %s %s over netlink: %w", l.family, l.table, err)
	}
	return conn, t, nil
}

// wrap names what was being listed; nil stays nil.
func (l netlinkLister) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("list the %s of table %s %s over netlink: %w", what, l.family, l.table, err)
}

func (l netlinkLister) ListAll(context.Context) (map[string][]string, error) {
	conn, t, err := l.open()
	if err != nil {
		return nil, err
	}
	chains, cerr := l.chains(conn, t)
	sets, serr := conn.GetSets(t)
	counters, oerr := l.counters(conn, t)
	flowtables, ferr := conn.ListFlowtables(t)
	if err := errors.Join(cerr, l.wrap("sets", serr), oerr, l.wrap("flowtables", ferr)); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	add := func(typ, name string) { out[typ] = append(out[typ], name) }
	for _, c := range chains {
		add("chain", c.Name)
	}
	for _, s := range sets {
		if s.IsMap && !s.Anonymous {
			add("map", s.Name)
		} else if !s.Anonymous {
			add("set", s.Name)
		}
	}
	for _, c := range counters {
		add("counter", c.Name)
	}
	for _, f := range flowtables {
		add("flowtable", f.Name)
	}
	return out, nil
}

func (l netlinkLister) chains(conn *gnft.Conn, t *gnft.Table) ([]*gnft.Chain, error) {
	all, err := conn.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, l.wrap("chains", err)
	}
	var out []*gnft.Chain
	for _, c := range all {
		if c.Table != nil && c.Table.Name == t.Name {
			out = append(out, c)
		}
	}
	return out, nil
}

// ListRules lists the rules of one chain, or of every chain (chain ""), with their handles and
// comments only: the backend describes rules by those (listRules).
func (l netlinkLister) ListRules(_ context.Context, chain string) ([]*knftables.Rule, error) {
	conn, t, err := l.open()
	if err != nil {
		return nil, err
	}
	names := []string{chain}
	if chain == "" {
		chains, err := l.chains(conn, t)
		if err != nil {
			return nil, err
		}
		names = names[:0]
		for _, c := range chains {
			names = append(names, c.Name)
		}
	}
	var out []*knftables.Rule
	for _, name := range names {
		rs, err := ruleHandles(t, name)
		if err != nil {
			return nil, l.wrap("rules of chain "+name, err)
		}
		for _, r := range rs {
			kr := &knftables.Rule{Chain: name, Handle: knftables.PtrTo(int(r.handle))}
			if c, ok := userdata.GetString(r.userData, userdata.TypeComment); ok {
				kr.Comment = &c
			}
			out = append(out, kr)
		}
	}
	return out, nil
}

// ruleHead is what ListRules reads of a rule: its handle and user data (the comment).
type ruleHead struct {
	handle   uint64
	userData []byte
}

// ruleHandles dumps the rules of chain in table t over netlink, in the calling thread's network
// namespace, decoding only their handles and user data. google/nftables' GetRules decodes every
// expression and fails on some the kernel accepts (v0.3.0 reads a ct expression's direction, one
// byte, as four: "attribute 3 is not a uint32"), which would fail every listing of a table with a
// "ct original" match; the backend needs neither the expressions nor that risk.
func ruleHandles(t *gnft.Table, chain string) ([]ruleHead, error) {
	var out []ruleHead
	err := nftDump(unix.NFT_MSG_GETRULE, byte(t.Family), []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: []byte(t.Name + "\x00")},
		{Type: unix.NFTA_RULE_CHAIN, Data: []byte(chain + "\x00")},
	}, func(ad *netlink.AttributeDecoder) {
		var r ruleHead
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_RULE_HANDLE:
				r.handle = ad.Uint64()
			case unix.NFTA_RULE_USERDATA:
				r.userData = ad.Bytes()
			}
		}
		out = append(out, r)
	})
	return out, err
}

// ListElements lists a map's or set's elements as nft writes ours (element, keyElement): address .
// protocol . port, and for maps address . port. An element that does not decode as ours is listed by
// its bytes, so that it differs from every element of ours.
func (l netlinkLister) ListElements(_ context.Context, objectType, name string) ([]*knftables.Element, error) {
	conn, t, err := l.open()
	if err != nil {
		return nil, err
	}
	s, err := conn.GetSetByName(t, name)
	if err != nil {
		return nil, l.wrap(objectType+" "+name, err)
	}
	els, err := conn.GetSetElements(s)
	if err != nil {
		return nil, l.wrap("elements of "+objectType+" "+name, err)
	}
	out := make([]*knftables.Element, 0, len(els))
	for _, e := range els {
		ke := &knftables.Element{Key: decodeKey(e.Key)}
		if objectType == "map" {
			ke.Map, ke.Value = name, decodeValue(e.Val)
		} else {
			ke.Set = name
		}
		if e.Comment != "" {
			ke.Comment = knftables.PtrTo(e.Comment)
		}
		out = append(out, ke)
	}
	return out, nil
}

func (l netlinkLister) ListCounters(context.Context) ([]*knftables.Counter, error) {
	conn, t, err := l.open()
	if err != nil {
		return nil, err
	}
	cs, err := l.counters(conn, t)
	if err != nil {
		return nil, err
	}
	out := make([]*knftables.Counter, 0, len(cs))
	for _, c := range cs {
		out = append(out, &knftables.Counter{Name: c.Name, Packets: knftables.PtrTo(c.Packets), Bytes: knftables.PtrTo(c.Bytes)})
	}
	return out, nil
}

func (l netlinkLister) counters(conn *gnft.Conn, t *gnft.Table) ([]*gnft.CounterObj, error) {
	objs, err := conn.GetObjects(t)
	if err != nil {
		return nil, l.wrap("named objects", err)
	}
	var out []*gnft.CounterObj
	for _, o := range objs {
		if c, ok := o.(*gnft.CounterObj); ok && c.Table != nil && c.Table.Name == t.Name {
			out = append(out, c)
		}
	}
	return out, nil
}

// decodeKey is encodeEntry's key (address . protocol . port, each field padded to 4 bytes) as the
// fields elementKeyFields writes.
func decodeKey(b []byte) []string {
	addr, rest, ok := decodeAddr(b, 8)
	if !ok {
		return []string{"0x" + hex.EncodeToString(b)}
	}
	proto, ok := protoNames[rest[0]]
	if !ok {
		return []string{"0x" + hex.EncodeToString(b)}
	}
	return []string{addr.String(), string(proto), strconv.Itoa(int(rest[4])<<8 | int(rest[5]))}
}

// decodeValue is encodeEntry's value (address . port) as element writes it.
func decodeValue(b []byte) []string {
	addr, rest, ok := decodeAddr(b, 4)
	if !ok {
		return []string{"0x" + hex.EncodeToString(b)}
	}
	return []string{addr.String(), strconv.Itoa(int(rest[0])<<8 | int(rest[1]))}
}

// decodeAddr splits b into an address (4 or 16 bytes) and the tail of tail bytes after it.
func decodeAddr(b []byte, tail int) (netip.Addr, []byte, bool) {
	n := len(b) - tail
	if n != 4 && n != 16 {
		return netip.Addr{}, nil, false
	}
	a, _ := netip.AddrFromSlice(b[:n])
	return a, b[n:], true
}

var protoNames = func() map[byte]rules.Protocol {
	m := map[byte]rules.Protocol{}
	for p, n := range protoNumbers {
		m[n] = p
	}
	return m
}()
