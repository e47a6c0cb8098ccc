package nftables

// Test address plan (documentation ranges only, so nothing here can collide with a real network):
//
//	pod CIDRs          10.244.0.0/16, 10.245.0.0/16     fd00:244::/64
//	cluster IPs        10.96.0.0/16                     fd00:96::/112
//	external IPs       203.0.113.0/24                   2001:db8:113::/64
//	loopback target    127.0.0.2 (counted in tests)     ::1
//	masquerade mark    0x4000

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/rules"
	tk "github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/nfgen"
)

// golden compares got with testdata/<name>.golden; `go test -update` (testkit's flag) rewrites it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	tk.Golden(t, filepath.Join("testdata", name+".golden"), got)
}

// addrs picks the test address of a family: v4 or v6.
func addrs(f rules.Family, v4, v6 string) string {
	if f == rules.IPv4 {
		return v4
	}
	return v6
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ad(s string) netip.Addr     { return netip.MustParseAddr(s) }
func pf(s string) netip.Prefix   { return netip.MustParsePrefix(s) }

// entry is a map entry: external address:port/proto -> cluster address:port.
func entry(f rules.Family, i int, proto rules.Protocol, port uint16, toPort uint16) rules.MapEntry {
	ext := addrs(f, fmt.Sprintf("203.0.%d.%d", 113+i/250, 1+i%250), fmt.Sprintf("2001:db8:113::%x", i+1))
	to := addrs(f, fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), fmt.Sprintf("fd00:96::%x", i+1))
	return rules.MapEntry{
		Addr: ad(ext), Protocol: proto, Port: port,
		To:      netip.AddrPortFrom(ad(to), toPort),
		Comment: fmt.Sprintf("ns%d/svc%d:%s-%d", i%7, i, proto, port),
	}
}

// externalIPRuleset looks like what the ipvs-externalip-dnat fix wants: DNAT local traffic to an
// external IP onto the Cluster-IP through a map, marking it for masquerade.
func externalIPRuleset(f rules.Family, entries []rules.MapEntry) *rules.Ruleset {
	podCIDRs := []netip.Prefix{pf(addrs(f, "10.244.0.0/16", "fd00:244::/64"))}
	if f == rules.IPv4 {
		podCIDRs = append(podCIDRs, pf("10.245.0.0/16"))
	}
	return &rules.Ruleset{
		Fix: "ipvs-externalip-dnat", Family: f,
		Chains: []rules.Chain{
			{Name: "EXTIP-PREROUTING", Type: rules.NAT, Hook: rules.Prerouting, Rules: []rules.Rule{
				{Match: rules.Match{SrcPrefixes: podCIDRs, Lookup: "external-ips"}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}, Comment: "pods to external IPs"},
				{Match: rules.Match{InInterfacePrefix: "cali", Lookup: "external-ips"}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}},
			}},
			{Name: "EXTIP-OUTPUT", Type: rules.NAT, Hook: rules.Output, Rules: []rules.Rule{
				{Match: rules.Match{SrcAddrType: rules.Local, Lookup: "external-ips"}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "EXTIP-DNAT"}, Comment: "host network to external IPs"},
			}},
			{Name: "EXTIP-DNAT", Type: rules.NAT, Rules: []rules.Rule{
				{Match: rules.Match{Lookup: "external-ips"}, SetMark: 0x4000, Verdict: rules.Verdict{Kind: rules.DNATLookup}, Counter: "dnat", Comment: "external IP to cluster IP"},
			}},
			{Name: "EXTIP-POSTROUTING", Type: rules.NAT, Hook: rules.Postrouting, Rules: []rules.Rule{
				{Match: rules.Match{Mark: 0x4000}, Verdict: rules.Verdict{Kind: rules.Masquerade}, Comment: "masquerade what we DNATed"},
				{Match: rules.Match{CTStatus: rules.CTDNAT, Lookup: "external-ips", LookupKey: rules.LookupCTOriginal}, Verdict: rules.Verdict{Kind: rules.Masquerade}, Comment: "masquerade by conntrack"},
			}},
		},
		Maps: []rules.Map{{Name: "external-ips", Entries: entries}},
	}
}

// invalidDropRuleset looks like what the invalid-drop fix wants, plus a counted rule on loopback
// traffic that the kernel tests can hit with real packets.
func invalidDropRuleset(f rules.Family) *rules.Ruleset {
	return &rules.Ruleset{
		Fix: "invalid-drop", Family: f,
		Chains: []rules.Chain{
			{Name: "INVALID-INPUT", Type: rules.Filter, Hook: rules.Input, Rules: []rules.Rule{
				{Match: rules.Match{CTStates: []rules.CTState{rules.CTInvalid}}, Verdict: rules.Verdict{Kind: rules.Drop}, Counter: "invalid-dropped", Comment: "network-node-manager:invalid-drop"},
			}},
			{Name: "PROBE-OUTPUT", Type: rules.Filter, Hook: rules.Output, Rules: []rules.Rule{
				{Match: rules.Match{DstAddr: ad(addrs(f, "127.0.0.2", "::1")), Protocol: rules.UDP, DstPort: 9999}, Counter: "probe", Comment: "test probe"},
			}},
		},
	}
}

// miscRuleset covers the remaining rule shapes: several protocols and ports, DNAT with and without a
// port, ct states, accept/return/jump, marks.
func miscRuleset(f rules.Family) *rules.Ruleset {
	return &rules.Ruleset{
		Fix: "misc", Family: f,
		Chains: []rules.Chain{
			{Name: "MISC-PREROUTING", Type: rules.NAT, Hook: rules.Prerouting, Rules: []rules.Rule{
				{Match: rules.Match{DstAddr: ad(addrs(f, "203.0.113.7", "2001:db8:113::7")), Protocol: rules.TCP, DstPort: 443}, Verdict: rules.Verdict{Kind: rules.DNAT, To: ap(addrs(f, "10.96.0.7:8443", "[fd00:96::7]:8443"))}},
				{Match: rules.Match{DstAddr: ad(addrs(f, "203.0.113.8", "2001:db8:113::8")), Protocol: rules.UDP, DstPort: 53}, Verdict: rules.Verdict{Kind: rules.DNAT, To: ap(addrs(f, "10.96.0.10:53", "[fd00:96::a]:53"))}},
				{Match: rules.Match{DstAddr: ad(addrs(f, "203.0.113.9", "2001:db8:113::9")), Protocol: rules.SCTP}, Verdict: rules.Verdict{Kind: rules.DNAT, To: netip.AddrPortFrom(ad(addrs(f, "10.96.0.11", "fd00:96::b")), 0)}},
			}},
			{Name: "MISC-FORWARD", Type: rules.Filter, Hook: rules.Forward, Rules: []rules.Rule{
				{Match: rules.Match{CTStates: []rules.CTState{rules.CTEstablished, rules.CTRelated}}, Verdict: rules.Verdict{Kind: rules.Accept}},
				{Match: rules.Match{InInterfacePrefix: "eth", Protocol: rules.TCP, DstPort: 22}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "MISC-SSH"}},
				{Match: rules.Match{Mark: 0x1}, SetMark: 0x2, Comment: "mark only"},
				{Match: rules.Match{Mark: 0x2}, ClearMark: 0x1, Comment: "clear a bit"},
			}},
			{Name: "MISC-SSH", Type: rules.Filter, Rules: []rules.Rule{
				{Match: rules.Match{SrcPrefixes: []netip.Prefix{pf(addrs(f, "192.0.2.0/24", "2001:db8:2::/48"))}}, Verdict: rules.Verdict{Kind: rules.Return}},
				{Counter: "ssh-dropped", Verdict: rules.Verdict{Kind: rules.Drop}},
			}},
		},
	}
}

// clampRuleset covers the mangle chain type, destination prefixes, output interfaces, TCP flags and
// both forms of the MSS clamp.
func clampRuleset(f rules.Family) *rules.Ruleset {
	pods := []netip.Prefix{pf(addrs(f, "10.244.0.0/16", "fd00:244::/64")), pf(addrs(f, "10.245.0.0/16", "fd00:245::/64"))}
	syn := func(m rules.Match) rules.Match { m.Protocol, m.TCPFlags = rules.TCP, rules.SYNNotRST; return m }
	return &rules.Ruleset{
		Fix: "clamp", Family: f,
		Chains: []rules.Chain{
			{Name: "CLAMP-FORWARD", Type: rules.Mangle, Hook: rules.Forward, Rules: []rules.Rule{
				{Match: syn(rules.Match{SrcPrefixes: pods}), Verdict: rules.Verdict{Kind: rules.ClampMSS}, Counter: "from-pods"},
				{Match: syn(rules.Match{DstPrefixes: pods}), Verdict: rules.Verdict{Kind: rules.ClampMSS}, Counter: "to-pods"},
				{Match: syn(rules.Match{InInterfacePrefix: "cali"}), Verdict: rules.Verdict{Kind: rules.ClampMSS, MSS: 1300}},
				{Match: syn(rules.Match{OutInterfacePrefix: "cali", DstPort: 443}), Verdict: rules.Verdict{Kind: rules.ClampMSS, MSS: 1300}, Comment: "fixed"},
				{Match: rules.Match{Protocol: rules.TCP, TCPFlags: rules.TCPFlags{Mask: rules.FIN | rules.SYN | rules.RST | rules.ACK, Set: 0}}, Verdict: rules.Verdict{Kind: rules.Drop}, Comment: "null scan"},
			}},
		},
	}
}

// recorder wraps a knftables.Interface (fake or real), keeps the text of every transaction run
// through it and can inject a failure. It is the backend's Lister of its table too, and counts the
// listings: they go to the fake, or on a real kernel over netlink (netlinkLister), as in production.
type recorder struct {
	knftables.Interface
	lister Lister // the listings' target: Interface (fake) or a netlinkLister (real kernel)
	mu     sync.Mutex
	sent   []string
	lists  int // List* calls
	// inject, if set, may change a transaction before it runs or fail it.
	inject func(tx *knftables.Transaction) error
	// after, if set, is called after a transaction ran without error.
	after func()
}

func (r *recorder) setAfter(fn func()) {
	r.mu.Lock()
	r.after = fn
	r.mu.Unlock()
}

func (r *recorder) Run(ctx context.Context, tx *knftables.Transaction) error {
	r.mu.Lock()
	inject := r.inject
	r.mu.Unlock()
	if inject != nil {
		if err := inject(tx); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.sent = append(r.sent, tx.String())
	after := r.after
	r.mu.Unlock()
	err := r.Interface.Run(ctx, tx)
	if err == nil && after != nil {
		after()
	}
	return err
}

func (r *recorder) listed() {
	r.mu.Lock()
	r.lists++
	r.mu.Unlock()
}

func (r *recorder) ListAll(ctx context.Context) (map[string][]string, error) {
	r.listed()
	return r.lister.ListAll(ctx)
}

func (r *recorder) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	r.listed()
	return r.lister.ListRules(ctx, chain)
}

func (r *recorder) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	r.listed()
	return r.lister.ListElements(ctx, objectType, name)
}

func (r *recorder) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	r.listed()
	// knftables v0.0.22's Fake dereferences its table without checking it exists; the real kernel
	// (netlinkLister) says "not found", and so does this.
	if f, ok := r.lister.(*knftables.Fake); ok {
		f.RLock()
		absent := f.Table == nil
		f.RUnlock()
		if absent {
			return nil, errNoTable
		}
	}
	return r.lister.ListCounters(ctx)
}

func (r *recorder) listCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists
}

// kernel hands out one recorder per table, over fakes (unit tests) or real nft (kernel tests).
type kernel struct {
	mu     sync.Mutex
	real   bool
	tables map[tableKey]*recorder
	fakes  map[tableKey]*knftables.Fake
	// genReads counts the generation reads of a real kernel's backend.
	genReads int
	// log, when set, receives the backend's log (text); nil discards it.
	log io.Writer
}

func newFakeKernel() *kernel {
	return &kernel{tables: map[tableKey]*recorder{}, fakes: map[tableKey]*knftables.Fake{}}
}

func newRealKernel() *kernel {
	k := newFakeKernel()
	k.real = true
	return k
}

func (k *kernel) newInterface(family knftables.Family, table string) (knftables.Interface, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := tableKey{family, table}
	if r := k.tables[key]; r != nil {
		return r, nil
	}
	var inner knftables.Interface
	var lister Lister
	if k.real {
		nft, err := newRealInterface(family, table)
		if err != nil {
			return nil, err
		}
		inner = nft
		if lister, err = newNetlinkLister(family, table); err != nil {
			return nil, err
		}
	} else {
		f := knftables.NewFake(family, table)
		k.fakes[key] = f
		inner, lister = f, f
	}
	r := &recorder{Interface: inner, lister: lister}
	k.tables[key] = r
	return r, nil
}

func (k *kernel) listTables(ctx context.Context, family knftables.Family) ([]TableInfo, error) {
	if k.real {
		return listRealTables(ctx, family)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []TableInfo
	for key, f := range k.fakes {
		if key.family == family && f.Table != nil {
			t := TableInfo{Name: key.table}
			if f.Table.Comment != nil {
				t.Comment = *f.Table.Comment
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// describeTable is Options.DescribeTable: over netlink on a real kernel, from the fake otherwise.
func (k *kernel) describeTable(ctx context.Context, family knftables.Family, table string) (*TableShape, error) {
	if k.real {
		return describeRealTable(ctx, family, table)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	f := k.fakes[tableKey{family, table}]
	if f == nil || f.Table == nil {
		return nil, errNoTable
	}
	s := &TableShape{}
	for _, c := range f.Table.Chains {
		s.Chains = append(s.Chains, c.Chain)
	}
	for name := range f.Table.Maps {
		s.Maps = append(s.Maps, name)
	}
	for name := range f.Table.Sets {
		s.Sets = append(s.Sets, name)
	}
	for name := range f.Table.Counters {
		s.Counters = append(s.Counters, name)
	}
	for name := range f.Table.Flowtables {
		s.Others = append(s.Others, "flowtable "+name)
	}
	return s, nil
}

func (k *kernel) rec(family knftables.Family, table string) *recorder {
	r, err := k.newInterface(family, table)
	if err != nil {
		panic(err)
	}
	return r.(*recorder)
}

func (k *kernel) backend(t testing.TB) *Backend {
	w := k.log
	if w == nil {
		w = io.Discard
	}
	log := slog.New(slog.NewTextHandler(w, nil))
	opts := Options{NewInterface: k.newInterface, ListTables: k.listTables, DescribeTable: k.describeTable, Logger: log,
		NewLister: func(family knftables.Family, table string) (Lister, error) { return k.newInterface(family, table) }}
	if k.real {
		// The real kernel's generation, read by the caller's thread (inside the test's namespace).
		opts.Generation = func() (uint32, error) {
			k.mu.Lock()
			k.genReads++
			k.mu.Unlock()
			return nfgen.Get()
		}
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sentSince returns the transactions a recorder ran after the first n.
func (r *recorder) sentSince(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent[n:]...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent)
}

// onlyElementOps fails unless every line of tx adds or deletes a map element.
func onlyElementOps(tx string) error {
	for _, line := range strings.Split(strings.TrimSpace(tx), "\n") {
		if !strings.HasPrefix(line, "add element ") && !strings.HasPrefix(line, "delete element ") {
			return errors.New("not an element operation: " + line)
		}
	}
	return nil
}

func nftFamily(f rules.Family) knftables.Family {
	ff, _ := familyOf(f)
	return ff.nft
}
