package nftables

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// transport can load the 10k table and add or delete the extra element, one way.
type transport struct {
	name                    string
	cold, add, delete, list func() error
	oneElems                []knftables.Element
}

// elementTransports returns the transports compared (nft -f, netlink with one socket, netlink with
// a socket per transaction) over the table of m, whose extra element is extra's; done closes them.
func elementTransports(b *testing.B, ns *netns.NS, m, extra *model) ([]transport, func()) {
	ctx := context.Background()
	mm := m.maps[0]
	elems, keyElems := elementsOf(mm)
	one := extra.maps[0]
	oneElems, oneKeys := elementsOf(one)
	var nft knftables.Interface
	if err := ns.Do(func() (err error) {
		nft, err = knftables.New(m.family, m.table)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	nl, err := newNetlinkTx(ns.Path(), m, mm, true)
	if err != nil {
		b.Fatal(err)
	}
	nlOnce, err := newNetlinkTx(ns.Path(), m, mm, false)
	if err != nil {
		b.Fatal(err)
	}

	nftRun := func(fill func(tx *knftables.Transaction)) func() error {
		return func() error {
			tx := nft.NewTransaction()
			fill(tx)
			return ns.Do(func() error { return nft.Run(ctx, tx) })
		}
	}
	transports := []transport{
		{
			name: "nft-f",
			cold: nftRun(func(tx *knftables.Transaction) {
				tx.Add(&knftables.Table{})
				tx.Add(&mm.m)
				tx.Add(&mm.keys)
				for i := range elems {
					tx.Add(&elems[i])
					tx.Add(&keyElems[i])
				}
			}),
			add: nftRun(func(tx *knftables.Transaction) {
				tx.Add(&oneElems[0])
				tx.Add(&oneKeys[0])
			}),
			delete: nftRun(func(tx *knftables.Transaction) {
				tx.Delete(&oneElems[0])
				tx.Delete(&oneKeys[0])
			}),
			list: func() error {
				return ns.Do(func() error { return allListed(nft.ListElements(ctx, "map", mm.m.Name)) })
			},
		},
		{
			name:   "netlink",
			cold:   func() error { return nl.load(mm.entries) },
			add:    func() error { return nl.elements(true, one.entries) },
			delete: func() error { return nl.elements(false, one.entries) },
			list:   func() error { return allListed(nl.conn.GetSetElements(nl.dmap)) },
		},
		{
			name:   "netlink-socket-per-tx",
			cold:   func() error { return nlOnce.load(mm.entries) },
			add:    func() error { return nlOnce.elements(true, one.entries) },
			delete: func() error { return nlOnce.elements(false, one.entries) },
			list:   func() error { return allListed(nlOnce.conn.GetSetElements(nlOnce.dmap)) },
		},
	}
	transports[0].oneElems = oneElems
	return transports, func() { nl.close(); nlOnce.close() }
}

// BenchmarkElementTransport measures the two ways of sending one nf_tables transaction of map
// elements: one `nft -f` process fed by knftables (what the backend does today) and one netlink
// batch sent with github.com/google/nftables, over a socket kept open (netlink) or over one opened
// and closed per transaction (netlink-socket-per-tx, google/nftables' default). All send the same objects:
// the ipvs-externalip-dnat shape (table, map ipv4_addr . inet_proto . inet_service :
// ipv4_addr . inet_service with a comment per element, and the map's companion key set; see
// build), built from the same model, and the benchmark first checks that both leave the kernel
// holding byte-identical `nft list table` output.
//
//	cold-10k          table + map + key set + 10,000 elements each, into a namespace without them
//	add-1-at-10k      one element (and its key) added to the 10,000-element map (and set)
//	delete-1-at-10k   one element (and its key) deleted from it
//	list-10k          the 10,000 elements of the map read back (knftables ListElements runs
//	                  `nft --json list map`; netlink: one GETSETELEM dump)
//
// Each iteration is one transaction, timed alone (the untimed inverse operation restores the
// state). ns/op is the median; min-ms and max-ms give the spread. Run as root (it makes a network
// namespace of its own):
//
//	go test ./backends/nftables -run '^$' -bench ElementTransport -benchtime 20x -count 1
func BenchmarkElementTransport(b *testing.B) {
	netns.Require(b, "nft")
	ns := netns.New(b, "nnm-tx")
	const n = transportElements
	f := rules.IPv4
	m, err := build(externalIPRuleset(f, manyEntries(f, n)))
	if err != nil {
		b.Fatal(err)
	}
	extra, err := build(externalIPRuleset(f, []rules.MapEntry{entry(f, 2*n, rules.UDP, 53, 53)}))
	if err != nil {
		b.Fatal(err)
	}
	transports, done := elementTransports(b, ns, m, extra)
	defer done()
	oneElems, one := transports[0].oneElems, extra.maps[0]
	table := string(m.family) + " " + m.table
	dropTable := func() error {
		_, err := ns.Exec("nft", "add table "+table+" ; delete table "+table)
		return err
	}
	// has reports whether the extra element is in the map and its key in the key set.
	has := func() (inMap, inSet bool) {
		key := "{ " + elementKey(&oneElems[0]) + " }"
		_, errMap := ns.Exec("nft", "get element "+table+" "+one.m.Name+" "+key)
		_, errSet := ns.Exec("nft", "get element "+table+" "+one.keys.Name+" "+key)
		return errMap == nil, errSet == nil
	}

	// Both transports must program the same kernel state.
	var listed []string
	for _, t := range transports {
		if err := t.cold(); err != nil {
			b.Fatalf("%s: cold load: %v", t.name, err)
		}
		listed = append(listed, ns.MustExec("nft", "list", "table", string(m.family), m.table))
		if err := dropTable(); err != nil {
			b.Fatal(err)
		}
	}
	for i := range listed {
		if listed[i] != listed[0] {
			b.Fatalf("nft -f and %s leave different tables:\n--- nft -f:\n%.2000s\n--- %s:\n%.2000s", transports[i].name, listed[0], transports[i].name, listed[i])
		}
	}

	for _, t := range transports {
		b.Run("cold-10k/"+t.name, func(b *testing.B) {
			measure(b, dropTable, t.cold)
		})
	}
	// The one-element cases start from the 10k table. The map and set made over netlink must be
	// the kernel objects nft makes: nft -f may "add" them again (the kernel refuses a different
	// definition with EEXIST), so that the two transports can share them.
	if err := dropTable(); err != nil {
		b.Fatal(err)
	}
	if err := transports[1].cold(); err != nil {
		b.Fatal(err)
	}
	if err := transports[0].cold(); err != nil {
		b.Fatalf("nft -f over the table made over netlink: %v", err)
	}
	// Each transport must really add and delete the element and its key.
	for _, t := range transports {
		if err := t.add(); err != nil {
			b.Fatalf("%s: add: %v", t.name, err)
		}
		if m, s := has(); !m || !s {
			b.Fatalf("%s: after add: element in map %v, key in set %v", t.name, m, s)
		}
		if err := t.delete(); err != nil {
			b.Fatalf("%s: delete: %v", t.name, err)
		}
		if m, s := has(); m || s {
			b.Fatalf("%s: after delete: element in map %v, key in set %v", t.name, m, s)
		}
	}
	for _, t := range transports {
		b.Run("list-10k/"+t.name, func(b *testing.B) {
			measure(b, func() error { return nil }, t.list)
		})
	}
	for _, t := range transports {
		b.Run("add-1-at-10k/"+t.name, func(b *testing.B) {
			measure(b, func() error { return nil }, t.add, t.delete)
		})
		b.Run("delete-1-at-10k/"+t.name, func(b *testing.B) {
			measure(b, t.add, t.delete, func() error { return nil })
		})
	}
}

// elementsOf renders the elements of mm's map and of its key set, as a transaction carries them.
func elementsOf(mm mapModel) (elems, keys []knftables.Element) {
	for _, e := range mm.entries {
		elems = append(elems, element(mm.m.Name, e))
		keys = append(keys, keyElement(mm.keys.Name, e))
	}
	return elems, keys
}

// transportElements is the size of the map BenchmarkElementTransport loads.
const transportElements = 10000

// allListed checks that a listing returned the whole map.
func allListed[E any](els []E, err error) error {
	if err != nil {
		return err
	}
	if len(els) != transportElements {
		return fmt.Errorf("listed %d elements, want %d", len(els), transportElements)
	}
	return nil
}

// measure times op alone b.N times, with before and after untimed around each run, and reports
// the median as ns/op and the spread as min-ms and max-ms.
func measure(b *testing.B, before, op func() error, after ...func() error) {
	b.Helper()
	times := make([]time.Duration, 0, b.N)
	b.StopTimer()
	for range b.N {
		if err := before(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		err := op()
		times = append(times, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		for _, a := range after {
			if err := a(); err != nil {
				b.Fatal(err)
			}
		}
	}
	slices.Sort(times)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(float64(times[len(times)/2]), "ns/op")
	b.ReportMetric(ms(times[0]), "min-ms")
	b.ReportMetric(ms(times[len(times)-1]), "max-ms")
}

// netlinkTx sends the model's table, map and key set over netlink in the namespace, one batch
// (BEGIN … END: one nf_tables transaction) per call: over one socket kept open (lasting) or over a
// socket opened and closed per call.
type netlinkTx struct {
	conn      *gnft.Conn
	nsFD      int
	table     *gnft.Table
	dmap, set *gnft.Set
	addrLen   int
}

func newNetlinkTx(nsPath string, m *model, mm mapModel, lasting bool) (*netlinkTx, error) {
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// nft raises its socket's send buffer to the batch size (mnl_set_sndbuffer); so must we, or
	// a 10k-element batch (~1.5 MB) exceeds the default buffer (EMSGSIZE).
	bigBuffer := func(c *netlink.Conn) error { return c.SetWriteBuffer(64 << 20) }
	opts := []gnft.ConnOption{gnft.WithNetNSFd(fd), gnft.WithSockOptions(bigBuffer)}
	if lasting {
		opts = append(opts, gnft.AsLasting())
	}
	conn, err := gnft.New(opts...)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	tx := &netlinkTx{conn: conn, nsFD: fd, addrLen: 4}
	addr := gnft.TypeIPAddr
	tx.table = &gnft.Table{Name: m.table, Family: gnft.TableFamilyIPv4}
	if m.family == knftables.IPv6Family {
		addr, tx.addrLen = gnft.TypeIP6Addr, 16
		tx.table.Family = gnft.TableFamilyIPv6
	}
	key := gnft.MustConcatSetType(addr, gnft.TypeInetProto, gnft.TypeInetService)
	// Concatenation stays false: google/nftables then sets NFT_SET_CONCAT, which nft 1.0.6 sets only
	// for interval sets, and the kernel refuses a later `nft -f` "add map" of the same map with
	// EEXIST (the definitions differ). Without it the kernel holds exactly what nft creates.
	tx.dmap = &gnft.Set{Table: tx.table, Name: mm.m.Name, IsMap: true, KeyType: key,
		DataType: gnft.MustConcatSetType(addr, gnft.TypeInetService)}
	tx.set = &gnft.Set{Table: tx.table, Name: mm.keys.Name, KeyType: key}
	return tx, nil
}

func (t *netlinkTx) close() {
	_ = t.conn.CloseLasting()
	_ = unix.Close(t.nsFD)
}

// load creates the table, the map and the set with their elements in one transaction.
func (t *netlinkTx) load(entries []rules.MapEntry) error {
	dmap, set := *t.dmap, *t.set // AddSet assigns batch-local ids: fresh copies per batch
	dmap.ID, set.ID = 0, 0
	t.conn.AddTable(t.table)
	me, ke, err := t.encode(entries)
	if err != nil {
		return err
	}
	if err := t.conn.AddSet(&dmap, nil); err != nil {
		return err
	}
	if err := t.conn.AddSet(&set, nil); err != nil {
		return err
	}
	for _, page := range pages(me) {
		if err := t.conn.SetAddElements(&dmap, me[page[0]:page[1]]); err != nil {
			return err
		}
		if err := t.conn.SetAddElements(&set, ke[page[0]:page[1]]); err != nil {
			return err
		}
	}
	return t.conn.Flush()
}

// elements adds (or deletes) elements of the existing map and their keys in one transaction.
func (t *netlinkTx) elements(add bool, entries []rules.MapEntry) error {
	me, ke, err := t.encode(entries)
	if err != nil {
		return err
	}
	op := t.conn.SetAddElements
	if !add {
		op = t.conn.SetDeleteElements
	}
	if err := op(t.dmap, me); err != nil {
		return err
	}
	if err := op(t.set, ke); err != nil {
		return err
	}
	return t.conn.Flush()
}

// encode is the netlink form of entries (encodeEntry, as loadMaps sends them) and of their keys.
func (t *netlinkTx) encode(entries []rules.MapEntry) ([]gnft.SetElement, []gnft.SetElement, error) {
	me := make([]gnft.SetElement, len(entries))
	ke := make([]gnft.SetElement, len(entries))
	for i, e := range entries {
		k, v, err := encodeEntry(e)
		if err != nil {
			return nil, nil, err
		}
		me[i] = gnft.SetElement{Key: k, Val: v}
		if e.Comment != "" {
			me[i].Comment = commentText(e.Comment)
		}
		ke[i] = gnft.SetElement{Key: k}
	}
	return me, ke, nil
}
