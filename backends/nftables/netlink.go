package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// A new table's maps are loaded over netlink (github.com/google/nftables) before the one `nft -f`
// transaction that adds its chains and rules: BenchmarkElementTransport measured a cold load of
// 10,000 map elements and their keys at 36-48 ms over netlink against 268-628 ms for `nft -f`
// (BENCHMARKS.md, "nftables transport"), and at the cold start this is most of the time before the
// rules are in the kernel. It is two transactions, which is harmless only because the table is new:
// the maps are complete before any rule that reads them exists, so no packet ever sees a partial
// map. A table that exists is always rewritten in one `nft -f` transaction. A change of map entries
// alone (a Service event) goes over netlink too, as one transaction of element operations
// (sendElementDiff): the same benchmark measured 0.01-0.05 ms for one element against 2-3 ms for an
// `nft -f` add and 14-16 ms for an `nft -f` delete.

// netlinkFamily is a table family of ours as google/nftables names it: the table family and the
// type of an address in it.
func netlinkFamily(f knftables.Family) (gnft.TableFamily, gnft.SetDatatype, error) {
	switch f {
	case knftables.IPv4Family:
		return gnft.TableFamilyIPv4, gnft.TypeIPAddr, nil
	case knftables.IPv6Family:
		return gnft.TableFamilyIPv6, gnft.TypeIP6Addr, nil
	}
	return 0, gnft.SetDatatype{}, fmt.Errorf("nftables backend: family %q is not ip or ip6", f)
}

// loadMaps creates m's table with its maps and their companion key sets, filled, in the calling
// thread's network namespace: the objects and the first elements in one netlink transaction, the
// rest in transactions of at most maxOpsPerTransaction elements (harmless for the same reason as the
// split from the rules' transaction: no rule reads the maps yet). The objects are exactly those nft
// creates from writeFull's `add map`/`add set` (so that transaction may add them again), which
// BenchmarkElementTransport and TestKernelColdLoadOverNetlink check.
func loadMaps(m *model) error {
	conn, err := gnft.New(gnft.WithSockOptions(forceSendBuffer))
	if err != nil {
		return err
	}
	t, addr, err := netlinkTable(m)
	if err != nil {
		return err
	}
	conn.AddTable(t)
	b := newElementBatch(conn, t, addr, m)
	for i := range m.maps {
		if err := conn.AddSet(b.maps[i].dmap, nil); err != nil {
			return err
		}
		if err := conn.AddSet(b.maps[i].keys, nil); err != nil {
			return err
		}
	}
	for i, mm := range m.maps {
		for _, e := range mm.entries {
			b.queue(i, e, true, true)
			if err := b.flushIfFull(); err != nil {
				return fmt.Errorf("load the maps of table %s %s over netlink: %w", m.family, m.table, err)
			}
		}
	}
	if err := b.flush(true); err != nil {
		return fmt.Errorf("load the maps of table %s %s over netlink: %w", m.family, m.table, err)
	}
	return nil
}

// maxOpsPerTransaction bounds the element operations of one netlink transaction, and with it the
// memory a change of map entries holds at once: google/nftables keeps every operation of a
// transaction as attributes and as marshalled messages until it is sent, ~0.6 KB each (a change of
// 10,000 entries to 10,000 others, 40,000 operations, held 23 MB), so one tenant's Service update
// of 5,000 ports would hold 12 MB. One place for the figure (TestKernelBoundedElementTransactions).
const maxOpsPerTransaction = 8192

// elementBatch queues element operations on m's maps and their key sets and sends them in netlink
// transactions of at most maxOpsPerTransaction operations (one more when an entry's operations
// straddle the bound: they are never split, so a replaced entry's delete and add
// are always one transaction and no entry that stays is ever missing from the map).
type elementBatch struct {
	conn *gnft.Conn
	maps []struct{ dmap, keys *gnft.Set }
	// per map: the deletes of map elements and of keys, the adds of map elements and of keys
	ops          [][4][]gnft.SetElement
	n            int // operations queued
	err          error
	operations   int // operations sent
	transactions int // transactions sent
}

// batchSent, when set (by tests), sees each transaction's operations before they are sent.
var batchSent func(ops [][4][]gnft.SetElement)

func newElementBatch(conn *gnft.Conn, t *gnft.Table, addr gnft.SetDatatype, m *model) *elementBatch {
	b := &elementBatch{conn: conn, maps: make([]struct{ dmap, keys *gnft.Set }, len(m.maps)), ops: make([][4][]gnft.SetElement, len(m.maps))}
	for i, mm := range m.maps {
		b.maps[i].dmap, b.maps[i].keys = mapSets(t, addr, mm)
	}
	return b
}

// queue queues entry e of map i: its add (add) or delete, and with withKey its key's in the key set.
func (b *elementBatch) queue(i int, e rules.MapEntry, withKey, add bool) {
	elem, key, err := setElement(e)
	if err != nil {
		b.err = errors.Join(b.err, err)
		return
	}
	o := &b.ops[i]
	switch {
	case add:
		o[2] = append(o[2], elem)
		if withKey {
			o[3] = append(o[3], key)
		}
	default:
		o[0] = append(o[0], key) // a delete names the key only
		if withKey {
			o[1] = append(o[1], key)
		}
	}
	b.n++
	if withKey {
		b.n++
	}
}

// flushIfFull sends the queued operations once they reach maxOpsPerTransaction. Call it only
// between entries.
func (b *elementBatch) flushIfFull() error {
	if b.n < maxOpsPerTransaction {
		return b.err
	}
	return b.flush(false)
}

// flush sends the queued operations (with always, also when there are none: the objects queued on
// the connection) as one transaction: per map, the deletes, then the adds.
func (b *elementBatch) flush(always bool) error {
	if b.err != nil {
		return b.err
	}
	if b.n == 0 && !always {
		return nil
	}
	if batchSent != nil {
		batchSent(b.ops)
	}
	for i := range b.ops {
		o := &b.ops[i]
		for _, err := range []error{
			sendPaged(b.conn.SetDeleteElements, b.maps[i].dmap, o[0]), sendPaged(b.conn.SetDeleteElements, b.maps[i].keys, o[1]),
			sendPaged(b.conn.SetAddElements, b.maps[i].dmap, o[2]), sendPaged(b.conn.SetAddElements, b.maps[i].keys, o[3]),
		} {
			if err != nil {
				return err
			}
		}
		for k := range o {
			clear(o[k]) // the elements' byte slices go with the transaction
			o[k] = o[k][:0]
		}
	}
	if err := b.conn.Flush(); err != nil {
		return err
	}
	b.operations += b.n
	b.transactions++
	b.n = 0
	return nil
}

// netlinkTable is m's table as google/nftables names it, and the type of an address in it.
func netlinkTable(m *model) (*gnft.Table, gnft.SetDatatype, error) {
	tf, addr, err := netlinkFamily(m.family)
	if err != nil {
		return nil, addr, err
	}
	return &gnft.Table{Name: m.table, Family: tf}, addr, nil
}

// mapSets are mm's map (address . protocol . port : address . port) and its companion key set in
// table t, as writeFull's `add map`/`add set` make them. Concatenation stays false: with it
// google/nftables sets NFT_SET_CONCAT, which nft sets only for interval sets, and a later `nft -f`
// "add map" of the same map then fails with EEXIST (the definitions differ).
func mapSets(t *gnft.Table, addr gnft.SetDatatype, mm mapModel) (dmap, keys *gnft.Set) {
	key := gnft.MustConcatSetType(addr, gnft.TypeInetProto, gnft.TypeInetService)
	dmap = &gnft.Set{Table: t, Name: mm.m.Name, IsMap: true, KeyType: key, DataType: gnft.MustConcatSetType(addr, gnft.TypeInetService)}
	return dmap, &gnft.Set{Table: t, Name: mm.keys.Name, KeyType: key}
}

// setElement is e as a map element (key, value and comment, as element() gives nft) and as its key
// set's element.
func setElement(e rules.MapEntry) (elem, key gnft.SetElement, err error) {
	k, v, err := encodeEntry(e)
	if err != nil {
		return elem, key, err
	}
	elem = gnft.SetElement{Key: k, Val: v}
	if e.Comment != "" {
		elem.Comment = commentText(e.Comment)
	}
	return elem, gnft.SetElement{Key: k}, nil
}

// sendPaged queues elems for s with send (SetAddElements, SetDeleteElements), one page at a time.
func sendPaged(send func(*gnft.Set, []gnft.SetElement) error, s *gnft.Set, elems []gnft.SetElement) error {
	if len(elems) == 0 {
		return nil
	}
	for _, p := range pages(elems) {
		if err := send(s, elems[p[0]:p[1]]); err != nil {
			return err
		}
	}
	return nil
}

// sendElementDiff sends the element operations that turn old's maps into m's (the same shape: the
// same table, maps and sets) in the calling thread's network namespace: the deletes, then the adds,
// of map elements and of their keys in the companion sets, the objects writeElementDiff gives `nft
// -f` (both walk diffElements). It is one netlink transaction, which the kernel applies all or none,
// unless it has more than maxOpsPerTransaction operations: then several, each entry's operations in
// one of them (elementBatch), so a failure may leave the first applied; the caller then rewrites
// the table from a listing. An element to delete that is not there fails its transaction. The
// socket is closed after the commit, in the background: closing a netlink socket right after an
// element deletion waited ~11 ms in the kernel (BENCHMARKS.md, "nftables transport"), time the
// change need not wait for.
func sendElementDiff(old, m *model) (operations, transactions int, err error) {
	t, addr, err := netlinkTable(m)
	if err != nil {
		return 0, 0, err
	}
	conn, err := gnft.New(gnft.AsLasting(), gnft.WithSockOptions(forceSendBuffer))
	if err != nil {
		return 0, 0, err
	}
	defer func() { go conn.CloseLasting() }()
	b := newElementBatch(conn, t, addr, m)
	for i := range m.maps {
		diffElements(old, m, i, func(e rules.MapEntry, withKey, add bool) {
			if err != nil {
				return
			}
			b.queue(i, e, withKey, add)
			// A replaced entry's delete comes right before its add: not between them.
			if add || withKey {
				err = errors.Join(err, b.flushIfFull())
			}
		})
		if err != nil {
			break
		}
	}
	if err == nil {
		err = b.flush(false)
	}
	if err != nil {
		return b.operations, b.transactions, fmt.Errorf("change the map elements of table %s %s over netlink (after %d transactions applied): %w",
			m.family, m.table, b.transactions, err)
	}
	return b.operations, b.transactions, nil
}

// forceSendBuffer raises the socket's send buffer past net.core.wmem_max, as nft does for its
// batches: a netlink message larger than the buffer is refused (EMSGSIZE), and 10,000 elements
// with their keys are about 1.6 MB. SO_SNDBUFFORCE needs CAP_NET_ADMIN, which the agent has.
func forceSendBuffer(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20)
	}); err != nil {
		return err
	}
	return serr
}

// pages cuts elements into runs whose element list fits one netlink attribute: its length field
// has 16 bits, and google/nftables silently truncates a longer list (the kernel then adds only the
// first elements, without an error), so the caller must split it, as libnftnl does.
func pages(elems []gnft.SetElement) [][2]int {
	const limit = 60000 // bytes, below the 65,535 of an attribute, with room for the headers
	var out [][2]int
	start, size := 0, 0
	for i, e := range elems {
		n := 48 + len(e.Key) + len(e.Val) + len(e.Comment) // attribute headers included
		if size+n > limit {
			out = append(out, [2]int{start, i})
			start, size = i, 0
		}
		size += n
	}
	return append(out, [2]int{start, len(elems)})
}

var protoNumbers = map[rules.Protocol]byte{rules.TCP: unix.IPPROTO_TCP, rules.UDP: unix.IPPROTO_UDP, rules.SCTP: unix.IPPROTO_SCTP}

// encodeEntry is e's key (address . protocol . port) and value (address . port) in the kernel's
// binary form: concatenated fields each padded to a 4-byte register, ports in network order. The
// value's port follows element's rule (zero keeps the original port).
func encodeEntry(e rules.MapEntry) (key, val []byte, err error) {
	p, ok := protoNumbers[e.Protocol]
	if !ok {
		return nil, nil, fmt.Errorf("map entry %s: unknown protocol", e.Key())
	}
	if e.Addr.Zone() != "" || e.To.Addr().Zone() != "" {
		// The binary form has no zone, and nft refuses one: the text transaction (the fallback)
		// then names the entry, where netlink would drop the zone and Verify never match.
		return nil, nil, fmt.Errorf("map entry %s -> %s: an address with a zone", e.Key(), e.To)
	}
	to := e.To.Port()
	if to == 0 {
		to = e.Port
	}
	key = append(e.Addr.Unmap().AsSlice(), p, 0, 0, 0)
	key = append(binary.BigEndian.AppendUint16(key, e.Port), 0, 0)
	val = append(binary.BigEndian.AppendUint16(e.To.Addr().Unmap().AsSlice(), to), 0, 0)
	return key, val, nil
}

// nftaTableUserdata is NFTA_TABLE_USERDATA (linux/netfilter/nf_tables.h), which x/sys/unix lacks.
const nftaTableUserdata = 0x6

// dumpTables lists the tables of one netlink family (NFPROTO_*) with their comments: a dump of
// NFT_MSG_GETTABLE, whose answers carry NFTA_TABLE_NAME and NFTA_TABLE_USERDATA (libnftnl's TLV,
// the comment under type 0, as a rule's).
func dumpTables(family byte) ([]TableInfo, error) {
	var out []TableInfo
	err := nftDump(unix.NFT_MSG_GETTABLE, family, nil, func(ad *netlink.AttributeDecoder) {
		var t TableInfo
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				t.Name = ad.String()
			case nftaTableUserdata:
				t.Comment, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
			}
		}
		if t.Name != "" {
			out = append(out, t)
		}
	})
	return out, err
}

// nftDump sends one nf_tables dump request (msg: an NFT_MSG_GET… type) for family with attrs over
// netlink, in the calling thread's network namespace, and calls each with the attributes of every
// message of the answer (big-endian), decoding nothing else: google/nftables decodes whole objects
// and fails on some the kernel accepts (see ruleHandles), and the backend reads only a few of their
// attributes.
func nftDump(msg int, family byte, attrs []netlink.Attribute, each func(ad *netlink.AttributeDecoder)) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	data := []byte{family, unix.NFNETLINK_V0, 0, 0} // struct nfgenmsg, res_id 0
	if len(attrs) > 0 {
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return err
		}
		data = append(data, b...)
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg), Flags: netlink.Request | netlink.Dump},
		Data:   data,
	})
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		each(ad)
		if err := ad.Err(); err != nil {
			return err
		}
	}
	return nil
}
