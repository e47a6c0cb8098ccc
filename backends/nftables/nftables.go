// Package nftables is the nftables implementation of backend.Backend.
//
// Every fix owns one table per family, `table ip nnm-<fix>` and `table ip6 nnm-<fix>`, and nothing
// else: other owners' tables (kube-proxy, iptables-nft's ip filter/nat) are never listed, flushed or
// changed. Chains hooked into the kernel are base chains of that table; lookup maps are nft maps
// with a companion set of their keys for membership tests (see mapModel), so 10,000 Services cost a
// lookup or two per packet and a change to one Service is an element operation in each. Changes go
// through sigs.k8s.io/knftables, one transaction (`nft -f`) per reconcile; tables are read back over
// netlink (lister.go: after a transaction, on a Verify, on a scrape), and a new table's maps are
// loaded over netlink (netlink.go). The knftables.Interface factory is the seam tests replace with
// knftables.NewFake, which then answers the listings too. The nf_tables generation (package nfgen)
// tells a Verify whether anything changed at all.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/nfgen"
)

// Name is the backend's name as it labels metrics.
const Name = backend.NFTables

// Options configures New. Zero values select the real kernel and slog.Default().
type Options struct {
	Logger *slog.Logger
	// NewInterface returns the knftables interface for one table. Nil means knftables.New, which runs
	// `nft` (twice at creation to check that nftables works, then once per transaction).
	NewInterface func(family knftables.Family, table string) (knftables.Interface, error)
	// ListTables returns all tables of one family (every owner's), with their comments. Nil means a
	// table dump over netlink (listRealTables). Cleanup uses it, and remove for a table this process
	// never touched.
	ListTables func(ctx context.Context, family knftables.Family) ([]TableInfo, error)
	// DescribeTable reads a table's objects with their definitions (TableShape), to tell whether a
	// table without a comment is an earlier version's or someone else's. Nil means a dump over
	// netlink (describeRealTable).
	DescribeTable func(ctx context.Context, family knftables.Family, table string) (*TableShape, error)
	// NewLister returns what reads one table back (Lister). Nil means netlinkLister when NewInterface
	// is nil too (the real kernel), and the table's knftables interface otherwise (a fake kernel).
	NewLister func(family knftables.Family, table string) (Lister, error)
	// Generation reads the nf_tables generation (see package nfgen). Nil means nfgen.Get when
	// NewInterface is nil too (the real kernel), and no generation otherwise (a fake kernel has none:
	// Verify then always lists).
	Generation backend.Generation
}

// Backend is the nftables backend: the shared Driver over this package's Ops.
type Backend = backend.Driver[*applied]

// Ops program rulesets as nftables tables (backend.Ops), and offer what the backend does beyond
// them (RemoveAll, RemoveFix, CleanupPlan). They are safe for concurrent use.
//
// The record of a table holds the model sent and the table as listed right after (objects and rule
// handles; a rule added, deleted or replaced gets a new handle). Matches lists our table alone and
// compares. Update sends only element operations when only map entries changed (what keeps a
// one-Service change cheap at 10,000 Services). Apply sends one transaction that rewrites the
// table's chains and maps (named counters keep their values), built from a trusted record without
// listing the table first; a transaction that the kernel refuses because the record was wrong is
// retried once against a fresh listing. Tables share nothing but the interface cache.
type Ops struct {
	// opts are New's options with the defaults filled in (NewLister stays nil with a fake kernel).
	opts Options
	log  *slog.Logger
	// loadMaps loads a new table's maps over netlink (the real kernel only; see netlink.go).
	loadMaps func(m *model) error
	// sendElements sends a change of map entries over netlink (the real kernel only; see
	// netlink.go) in one or more transactions; with a fake kernel element changes go through
	// knftables.
	sendElements func(old, m *model) (operations, transactions int, err error)

	// imu guards ifaces only; no lock is held while nft runs.
	imu    sync.Mutex
	ifaces map[tableKey]knftables.Interface
}

var _ backend.Ops[*applied] = (*Ops)(nil)

type tableKey struct {
	family knftables.Family
	table  string
}

// applied is the record of what the last successful reconcile of one table put into the kernel.
type applied struct {
	model *model
	// seen is the kernel's table as snapshot() saw it right after that reconcile, without the
	// elements of maps and sets: those are model's entries (withElements renders them when a Verify
	// must compare).
	seen *tableState
}

// New returns the backend: the Driver over NewOps(opts). It does no I/O: nft is first run by the
// first call that needs the kernel.
func New(opts Options) (*Backend, error) {
	b, err := NewOps(opts)
	if err != nil {
		return nil, err
	}
	return backend.New[*applied](b, b.opts.Generation, b.log), nil
}

// NewOps returns the backend's operations. Driven by nothing (no records), they remove what
// another agent's run left (backends.Leftovers).
func NewOps(opts Options) (*Ops, error) {
	b := &Ops{log: opts.Logger, ifaces: map[tableKey]knftables.Interface{}}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.log = b.log.With("backend", Name)
	if opts.NewInterface == nil {
		opts.NewInterface = newRealInterface
		b.loadMaps, b.sendElements = loadMaps, sendElementDiff
		if opts.Generation == nil {
			opts.Generation = nfgen.Get
		}
		if opts.NewLister == nil {
			opts.NewLister = newNetlinkLister
		}
	}
	if opts.ListTables == nil {
		opts.ListTables = listRealTables
	}
	if opts.DescribeTable == nil {
		opts.DescribeTable = describeRealTable
	}
	b.opts = opts
	return b, nil
}

// Name is part of backend.Ops.
func (b *Ops) Name() string { return Name }

// Render returns the `nft -f` input of the transaction Apply sends when the kernel holds nothing of
// this table yet (a cold apply, or the text `plan` shows). Against an existing table Apply sends
// the same lines plus, before them, a flush of the table's chains and deletes of objects being
// re-created, and after them deletes of counters no longer wanted; see writeFull.
func (b *Ops) Render(rs *rules.Ruleset) (string, error) {
	m, err := build(rs)
	if err != nil {
		return "", err
	}
	tx := knftables.NewFake(m.family, m.table).NewTransaction()
	writeFull(tx, m, nil, false)
	return tx.String(), nil
}

// iface returns the (cached) knftables interface of a table. Creating one runs nft, so it happens
// outside imu: a table whose nft hangs holds up no other table.
func (b *Ops) iface(k tableKey) (knftables.Interface, error) {
	b.imu.Lock()
	nft := b.ifaces[k]
	b.imu.Unlock()
	if nft != nil {
		return nft, nil
	}
	nft, err := b.opts.NewInterface(k.family, k.table)
	if err != nil {
		return nil, err
	}
	b.imu.Lock()
	defer b.imu.Unlock()
	if had := b.ifaces[k]; had != nil {
		return had, nil // made meanwhile by a scrape of the same table
	}
	b.ifaces[k] = nft
	return nft, nil
}

// reader returns what reads table k back: a Lister of its own when there is one (netlink, on the
// real kernel: no nft run and no interface needed), else the table's knftables interface.
func (b *Ops) reader(k tableKey) (Lister, error) {
	if b.opts.NewLister != nil {
		return b.opts.NewLister(k.family, k.table)
	}
	return b.iface(k)
}

// table returns the key and interface of a unit's table.
func (b *Ops) table(u backend.Unit) (tableKey, knftables.Interface, error) {
	k, err := keyOf(u.Fix, u.Family)
	if err != nil {
		return k, nil, err
	}
	nft, err := b.iface(k)
	return k, nft, err
}

func keyOf(fix string, family rules.Family) (tableKey, error) {
	f, err := familyOf(family)
	if err != nil {
		return tableKey{}, err
	}
	if !rules.ValidFixID(fix) {
		return tableKey{}, fmt.Errorf("nftables backend: fix id %q is not kebab-case", fix)
	}
	return tableKey{family: f.nft, table: TableName(fix)}, nil
}

// Begin is part of backend.Ops: a fix id must name a table.
func (b *Ops) Begin(_ context.Context, u backend.Unit, _ backend.Mode) error {
	_, err := keyOf(u.Fix, u.Family)
	return err
}

func (b *Ops) Matches(ctx context.Context, u backend.Unit, rec *applied) (bool, error) {
	k, err := keyOf(u.Fix, u.Family)
	if err != nil {
		return false, err
	}
	r, err := b.reader(k)
	if err != nil {
		return false, err
	}
	now, err := snapshot(ctx, r, true)
	if err != nil {
		return false, fmt.Errorf("nftables backend: list table %s %s: %w", k.family, k.table, explain(err))
	}
	return now.equal(rec.seen.withElements(rec.model)), nil
}

func (b *Ops) Update(ctx context.Context, u backend.Unit, prev backend.Prev[*applied], c backend.Change) (backend.Step[*applied], error) {
	rec := prev.Rec
	var step backend.Step[*applied]
	if c.Chains {
		return step, nil // only map entries go by element operations
	}
	m, err := build(c.To)
	if err != nil {
		return step, err
	}
	if !sameShape(rec.model, m) {
		return step, nil
	}
	step.Done, step.Rec = true, &applied{model: m, seen: rec.seen}
	if len(c.Maps) == 0 {
		return step, nil
	}
	n, commits, err := b.applyElements(ctx, u, rec.model, m)
	if err != nil {
		// ErrStale makes the Driver list the table and rewrite it, which also repairs the first
		// transactions of a change that sent several (sendElementDiff).
		b.log.Info("map update failed, rewriting the table", "fix", u.Fix, "family", u.Family, "err", err)
		return backend.Step[*applied]{}, backend.ErrStale
	}
	// Each element transaction is one commit with at least one real change.
	step.Applied, step.Commits = true, commits
	b.log.Debug("applied map changes", "fix", u.Fix, "family", u.Family, "operations", n, "transactions", commits)
	return step, nil
}

// applyElements sends the element operations that turn old's maps into m's (the same shape): over
// netlink on the real kernel (sendElementDiff, in transactions of bounded size), else with the
// table's knftables interface in one transaction. It returns the operations and transactions sent.
func (b *Ops) applyElements(ctx context.Context, u backend.Unit, old, m *model) (int, int, error) {
	if b.sendElements != nil {
		return b.sendElements(old, m)
	}
	_, nft, err := b.table(u)
	if err != nil {
		return 0, 0, err
	}
	tx := nft.NewTransaction()
	writeElementDiff(tx, old, m)
	return tx.NumOperations(), 1, nft.Run(ctx, tx)
}

func (b *Ops) Apply(ctx context.Context, u backend.Unit, prev backend.Prev[*applied], desired *rules.Ruleset) (backend.Step[*applied], error) {
	var step backend.Step[*applied]
	m, err := build(desired)
	if err != nil {
		return step, err
	}
	log := b.log.With("fix", u.Fix, "family", string(u.Family), "table", m.table)
	k, nft, err := b.table(u)
	if err != nil {
		return step, err
	}
	// A table is rewritten from a listing only once it is known to be ours (claim): someone else's
	// of the same name is left untouched and the unit is blocked; an earlier version's is replaced.
	var ex *existing
	adopt := false
	if prev.Trusted {
		ex = prev.Rec.model.existing()
	} else if adopt, err = b.claim(ctx, k, &step); err != nil {
		return step, err
	} else if !adopt {
		if ex, err = b.listExisting(ctx, k, &step); err != nil {
			return step, err
		}
	}
	ctx = context.WithoutCancel(ctx) // from here on the kernel is changed: finish what was started
	tx, err := b.write(ctx, nft, m, ex, adopt, log)
	if err != nil && prev.Trusted {
		// The record was wrong about the kernel (an object deleted or redefined behind our back, or
		// the table replaced): look at the table and rewrite it from what is really there.
		log.Info("rewrite from our record failed; listing the table and rewriting it", "err", err)
		if adopt, err = b.claim(ctx, k, &step); err != nil {
			return step, err
		}
		ex = nil
		if !adopt {
			if ex, err = b.listExisting(ctx, k, &step); err != nil {
				return step, err
			}
		}
		if ex != nil {
			ex.known = prev.Rec.model
		}
		tx, err = b.write(ctx, nft, m, ex, adopt, log)
	}
	if err != nil {
		// The transaction is atomic: the kernel still holds what it held, maybe not the record.
		step.Unsure = true
		return step, refusal(ctx, fmt.Errorf("nftables backend: apply table %s %s (%d operations): %w",
			k.family, k.table, tx.NumOperations(), explain(err)))
	}
	step.Applied = true
	log.Debug("applied", "operations", tx.NumOperations())
	// The record: the maps hold exactly m's elements (the transaction flushed and refilled them
	// atomically), so only objects and rules, which get kernel-assigned handles, are read back.
	step.Rec = &applied{model: m}
	step.ReadBack = true
	step.Finish = func(ctx context.Context) (*applied, error) {
		r, err := b.reader(k)
		if err != nil {
			return nil, err
		}
		seen, err := snapshot(ctx, r, false)
		if err != nil {
			return nil, fmt.Errorf("nftables backend: applied, but cannot read table %s %s back (the next reconcile rewrites it): %w", k.family, k.table, err)
		}
		if err := seen.holds(m); err != nil {
			return nil, fmt.Errorf("%w: table %s %s: %v", backend.ErrInterfered, k.family, k.table, err)
		}
		return &applied{model: m, seen: seen}, nil
	}
	return step, nil
}

// Check is part of backend.Ops: nft --check of a transaction that deletes the table and makes it
// hold desired from nothing (elements as text), committing nothing.
func (b *Ops) Check(ctx context.Context, u backend.Unit, desired *rules.Ruleset) error {
	m, err := build(desired)
	if err != nil {
		return err
	}
	_, nft, err := b.table(u)
	if err != nil {
		return err
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	writeFull(tx, m, nil, false)
	if err := nft.Check(ctx, tx); err != nil {
		return refusal(ctx, err)
	}
	return nil
}

// refusal marks an error of an nft run that reached nft's parser or the kernel (not a cancelled
// or failed start) as a refusal of the content (backend.ErrRejected).
func refusal(ctx context.Context, err error) error {
	if ctx.Err() != nil || !strings.Contains(err.Error(), "Error:") {
		return err
	}
	return rejected{err}
}

// rejected is an nft error that refused the content.
type rejected struct{ error }

func (e rejected) Unwrap() []error { return []error{e.error, backend.ErrRejected} }

// write sends one transaction that makes the table hold m, given what it holds (ex, nil: no table).
// A new table's maps go over netlink first (see loadMaps); if the transaction then fails, the
// half-made table is deleted again, so that nothing of the attempt stays. With replace (an earlier
// version's table, adopted) the transaction deletes the table first and makes it anew with the
// owner comment, which an existing table cannot be given.
func (b *Ops) write(ctx context.Context, nft knftables.Interface, m *model, ex *existing, replace bool, log *slog.Logger) (*knftables.Transaction, error) {
	if replace {
		tx := nft.NewTransaction()
		tx.Delete(&knftables.Table{})
		writeFull(tx, m, nil, false)
		return tx, nft.Run(ctx, tx)
	}
	loaded := false
	if ex == nil && b.loadMaps != nil && len(m.maps) > 0 {
		// The table is made with its owner comment first: loadMaps creates it over netlink
		// without one (google/nftables sets no table userdata), and a comment cannot be added to
		// an existing table. One nft run more, for a new table only.
		mk := nft.NewTransaction()
		mk.Add(m.tableObject())
		if err := nft.Run(ctx, mk); err != nil {
			return mk, err
		}
		if err := b.loadMaps(m); err != nil {
			log.Info("cannot load the maps over netlink; nft -f sends them with the rest", "err", err)
		} else {
			loaded = true
		}
	}
	tx := nft.NewTransaction()
	writeFull(tx, m, ex, loaded)
	err := nft.Run(ctx, tx)
	if err != nil && loaded {
		del := nft.NewTransaction()
		del.Delete(&knftables.Table{})
		if derr := nft.Run(ctx, del); derr != nil {
			log.Warn("cannot delete the table whose maps were loaded", "err", derr)
		}
	}
	return tx, err
}

// listExisting lists our table for a rewrite (nil when absent), counting the listing in step.
func (b *Ops) listExisting(ctx context.Context, k tableKey, step *backend.Step[*applied]) (*existing, error) {
	step.ReadBack = true
	r, err := b.reader(k)
	if err != nil {
		return nil, err
	}
	ex, err := listExisting(ctx, r)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("nftables backend: list table %s %s: %w", k.family, k.table, explain(err))
	}
	return ex, nil
}

// existing is what the kernel holds when it holds exactly m: the objects a rewrite from a trusted
// record must flush and replace.
func (m *model) existing() *existing {
	ex := &existing{trusted: true, known: m, counters: slices.Clone(m.counters)}
	for _, c := range m.chains {
		ex.chains = append(ex.chains, c.chain.Name)
	}
	for _, mm := range m.maps {
		ex.maps = append(ex.maps, mm.m.Name)
		ex.sets = append(ex.sets, mm.keys.Name)
	}
	sort.Strings(ex.chains)
	sort.Strings(ex.maps)
	sort.Strings(ex.sets)
	sort.Strings(ex.counters)
	return ex
}

// tableState describes our table as the kernel holds it. Counter values are left out, so traffic
// does not make a table look changed.
type tableState struct {
	// names: the sorted names of the table's chains, maps, counters (and anything else in it) by
	// type ("chain", "map", ...); nil when the table is absent.
	names map[string][]string
	// rules: see listRules; perChain: how many rules each chain holds.
	rules    string
	perChain map[string]int
	// elements: per map and set, its sorted elements with values and comments (nil: not listed).
	elements map[string]string
}

func (s *tableState) sameElements(o *tableState) bool {
	if len(s.elements) != len(o.elements) {
		return false
	}
	for name, v := range s.elements {
		if ov, ok := o.elements[name]; !ok || ov != v {
			return false
		}
	}
	return true
}

// holds says how s differs from what an Apply of m just made of the table (nil: it does not):
// other chains, maps, sets or counters, or a chain holding another number of rules. Run on the
// read-back after an Apply, it tells a record made of our transaction from one that took in someone
// else's change committed between our transaction and the read-back (a flushed chain, a deleted
// table).
func (s *tableState) holds(m *model) error {
	want := map[string][]string{}
	for _, c := range m.chains {
		want["chain"] = append(want["chain"], c.chain.Name)
		if n := s.perChain[c.chain.Name]; n != len(c.rules) {
			return fmt.Errorf("chain %s holds %d rules, %d were applied", c.chain.Name, n, len(c.rules))
		}
	}
	for _, mm := range m.maps {
		want["map"] = append(want["map"], mm.m.Name)
		want["set"] = append(want["set"], mm.keys.Name)
	}
	want["counter"] = m.counters
	for _, typ := range []string{"chain", "map", "set", "counter"} {
		w := slices.Sorted(slices.Values(want[typ]))
		if !slices.Equal(w, s.names[typ]) {
			return fmt.Errorf("the table's %ss are [%s], [%s] were applied", typ, strings.Join(s.names[typ], " "), strings.Join(w, " "))
		}
	}
	return nil
}

func (s *tableState) equal(o *tableState) bool {
	return (s.names == nil) == (o.names == nil) && maps.EqualFunc(s.names, o.names, slices.Equal[[]string]) &&
		s.rules == o.rules && s.sameElements(o)
}

// withElements is s after an element-only transaction that made the maps and sets hold m's elements.
func (s *tableState) withElements(m *model) *tableState {
	out := &tableState{names: s.names, rules: s.rules, perChain: s.perChain, elements: map[string]string{}}
	lines := func(elem func(rules.MapEntry) knftables.Element, entries []rules.MapEntry) string {
		els := make([]*knftables.Element, len(entries))
		for i, e := range entries {
			el := elem(e)
			els[i] = &el
		}
		return elementLines(els)
	}
	for _, mm := range m.maps {
		out.elements[mm.m.Name] = lines(func(e rules.MapEntry) knftables.Element { return element(mm.m.Name, e) }, mm.entries)
		out.elements[mm.keys.Name] = lines(func(e rules.MapEntry) knftables.Element { return keyElement(mm.keys.Name, e) }, mm.entries)
	}
	return out
}

func elementLines(els []*knftables.Element) string {
	lines := make([]string, 0, len(els))
	for _, e := range els {
		c := ""
		if e.Comment != nil {
			c = *e.Comment
		}
		lines = append(lines, fmt.Sprintf("%s : %s %q", elementKey(e), strings.Join(e.Value, " . "), c))
	}
	sort.Strings(lines)
	return strings.Join(lines, ", ")
}

// listRules describes the rules of our table by chain, handle and comment: any rule added,
// deleted or replaced gets a new handle. One `nft --json --terse list table` run.
func listRules(ctx context.Context, nft Lister) (string, map[string]int, error) {
	rs, err := nft.ListRules(ctx, "")
	if isNotFound(err) {
		return "absent", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	perChain := map[string][]string{}
	for _, r := range rs {
		h, c := -1, ""
		if r.Handle != nil {
			h = *r.Handle
		}
		if r.Comment != nil {
			c = *r.Comment
		}
		perChain[r.Chain] = append(perChain[r.Chain], fmt.Sprintf("%d %q", h, c))
	}
	var sb strings.Builder
	counts := make(map[string]int, len(perChain))
	for _, ch := range slices.Sorted(maps.Keys(perChain)) {
		fmt.Fprintf(&sb, "chain %s: %s\n", ch, strings.Join(perChain[ch], ", "))
		counts[ch] = len(perChain[ch])
	}
	return sb.String(), counts, nil
}

// snapshot lists our table: object names, rules, and (withElements) every map's elements.
func snapshot(ctx context.Context, nft Lister, withElements bool) (*tableState, error) {
	objs, err := nft.ListAll(ctx)
	if isNotFound(err) {
		return &tableState{rules: "absent"}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &tableState{names: map[string][]string{}}
	for _, typ := range []string{"chain", "map", "set", "counter", "flowtable"} {
		st.names[typ] = slices.Sorted(slices.Values(objs[typ]))
	}
	if st.rules, st.perChain, err = listRules(ctx, nft); err != nil {
		return nil, err
	}
	if !withElements {
		return st, nil
	}
	st.elements = map[string]string{}
	for _, typ := range []string{"map", "set"} {
		for _, name := range objs[typ] {
			els, err := nft.ListElements(ctx, typ, name)
			if err != nil {
				return nil, err
			}
			st.elements[name] = elementLines(els)
		}
	}
	return st, nil
}

// Remove deletes the fix's table of that family.
func (b *Ops) Remove(ctx context.Context, u backend.Unit, prev backend.Prev[*applied]) (backend.Step[*applied], error) {
	var step backend.Step[*applied]
	k, err := keyOf(u.Fix, u.Family)
	if err != nil {
		return step, err
	}
	// One table listing says whether there is anything to delete (where creating the table's
	// interface, nft --version and nft --check, and deleting would run nft three times: at start,
	// when the engine removes every disabled fix's tables, most of the fixed cost before the first
	// rules reach the kernel), and whether it is ours to delete: a table of that name that is not
	// ours is not the fix's, and stays.
	step.ReadBack = true
	switch o, why, err := b.owner(ctx, k); {
	case err != nil || o == noTable:
		return step, err
	case o == foreignTable:
		b.log.Info("leaving a table named like the fix's that is not ours", "fix", u.Fix, "table", string(k.family)+" "+k.table, "why", why)
		return step, nil
	}
	step.Applied, err = b.removeTable(context.WithoutCancel(ctx), k)
	return step, err
}

// removeTable deletes the table; it reports whether there was one.
func (b *Ops) removeTable(ctx context.Context, k tableKey) (bool, error) {
	nft, err := b.iface(k)
	if err != nil {
		return false, err
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		if knftables.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("nftables backend: delete table %s %s: %w", k.family, k.table, explain(err))
	}
	return true, nil
}

// Counters is part of backend.Ops: it reads the named counters of the fix's table (a listing: the
// record names nothing the table does not).
func (b *Ops) Counters(ctx context.Context, u backend.Unit, _ *applied, _ bool) (map[string]backend.Counter, error) {
	k, err := keyOf(u.Fix, u.Family)
	if err != nil {
		return nil, err
	}
	nft, err := b.reader(k) // no unit's lock: a scrape never waits for a reconcile
	if err != nil {
		return nil, err
	}
	out := map[string]backend.Counter{}
	cs, err := nft.ListCounters(ctx) // one listing per scrape: the table lookup says "not found"
	if isNotFound(err) {
		return out, nil // no table, no counters
	}
	if err != nil {
		return nil, fmt.Errorf("nftables backend: list counters of %s %s: %w", k.family, k.table, err)
	}
	for _, c := range cs {
		if c == nil { // knftables v0.0.22's Fake pads the list with nils
			continue
		}
		var v backend.Counter
		if c.Packets != nil {
			v.Packets = *c.Packets
		}
		if c.Bytes != nil {
			v.Bytes = *c.Bytes
		}
		if name, ok := strings.CutPrefix(c.Name, CounterPrefix); ok {
			out[name] = v
		}
	}
	return out, nil
}

// Cleanup is part of backend.Ops: it deletes every table named nnm-* in families ip and ip6,
// whichever fix (or process) created it.
func (b *Ops) Cleanup(ctx context.Context) error {
	_, err := b.RemoveAll(ctx)
	return err
}

// RemoveAll deletes every nnm-* table of families ip and ip6 and returns how many there were: Cleanup,
// and the removal of what this backend left when the agent runs with the iptables backend now
// (backends.Leftovers).
func (b *Ops) RemoveAll(ctx context.Context) (removed int, err error) {
	return b.removeTables(ctx, func(ownedTable) bool { return true })
}

// RemoveFix deletes fix's tables (ip and ip6 nnm-<fix>) and returns how many there were: the one
// fix's share of RemoveAll, once the iptables backend has that fix's replacement in
// (backends.Leftovers).
func (b *Ops) RemoveFix(ctx context.Context, fix string) (removed int, err error) {
	return b.removeTables(ctx, func(t ownedTable) bool { return t.table == TableName(fix) })
}

// removeTables deletes the tables of ours that pick chooses and returns how many there were.
func (b *Ops) removeTables(ctx context.Context, pick func(ownedTable) bool) (removed int, err error) {
	tables, err := b.ownTables(ctx)
	errs := []error{err}
	for _, t := range tables {
		if !pick(t) {
			continue
		}
		if t.earlier {
			b.log.Info("removing a table an earlier version of the agent made (no owner comment)", "table", string(t.family)+" "+t.table)
		}
		gone, err := b.removeTable(ctx, t.tableKey)
		if err != nil {
			errs = append(errs, err)
		} else if gone {
			removed++
		}
	}
	return removed, errors.Join(errs...)
}

// realOptions are the knftables options of the real kernel. NoObjectCommentEmulation: we put
// comments only on rules and elements, so the `nft --check` that knftables.New runs to probe
// comments on tables, chains, sets and maps is not needed (one nft process less before a table's
// first transaction). knftables' experimental UseNetlink (List and ListAll over netlink) is not used:
// it does not cover rules, elements or counters, in v0.0.22 a missing table comes back as a bare
// ENOENT that IsNotFound does not recognise, and its listing includes nft's anonymous sets (__set0),
// which we would then delete. netlinkLister (lister.go) reads all of them.
var realOptions = []knftables.Option{knftables.NoObjectCommentEmulation}

// newRealInterface is the default Options.NewInterface. It turns the causes users hit into errors
// that name them.
func newRealInterface(family knftables.Family, table string) (knftables.Interface, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nftables backend: nft binary not found; install nftables (%w)", err)
	}
	nft, err := knftables.New(family, table, realOptions...)
	if err != nil {
		return nil, fmt.Errorf("nftables backend: nftables is not usable here (kernel without nf_tables, "+
			"nft older than 1.0.1, or missing CAP_NET_ADMIN): %w", err)
	}
	return nft, nil
}

// listRealTables is the default Options.ListTables. It asks the kernel for the family's tables over
// netlink (a table dump: NFT_MSG_GETTABLE) in the calling thread's network namespace, with each
// table's comment (its userdata, which github.com/google/nftables does not decode).
// `nft --json list tables` is not used: nft fetches the whole ruleset for it, rules included, and
// beside kube-proxy's or our own 30,000 iptables-nft rules one listing cost 6.4 s of CPU (5.2 s
// of it in the kernel) for ip and as much for an empty ip6 (BENCHMARKS.md, 30,000 Services).
func listRealTables(_ context.Context, family knftables.Family) ([]TableInfo, error) {
	fam, _, err := netlinkFamily(family)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	tables, err := dumpTables(byte(fam))
	if err != nil {
		return nil, fmt.Errorf("nftables backend: list %s tables (kernel without nf_tables, or no CAP_NET_ADMIN?): %w", family, err)
	}
	return tables, nil
}

// TableInfo is one table of the kernel: its name and its comment ("" for none).
type TableInfo struct {
	Name, Comment string
}

// tableNames is the names of tables.
func tableNames(tables []TableInfo) []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = t.Name
	}
	return out
}

// OwnerComment is the comment on every table this backend makes, and what makes a table ours: a
// table named nnm-<something> without it is someone else's (issue #41: an iptables-backend agent
// deleted a foreign `ip nnm-thirdparty-…` table at start, by its name alone).
func OwnerComment(fix string) string { return ownerPrefix + fix }

const ownerPrefix = "network-node-manager:"

// ours says whether t is a table of this backend (see OwnerComment).
func ours(t TableInfo) bool {
	return strings.HasPrefix(t.Name, TablePrefix) && t.Comment == OwnerComment(strings.TrimPrefix(t.Name, TablePrefix))
}

// explain adds the likely cause to nft errors whose text alone is cryptic.
func explain(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "Operation not supported") || strings.Contains(msg, "Protocol not supported"):
		return fmt.Errorf("%w (the kernel lacks an nftables feature this ruleset needs, e.g. nft_nat, nft_fib, nft_ct or nft_counter)", err)
	case strings.Contains(msg, "Operation not permitted"):
		return fmt.Errorf("%w (needs CAP_NET_ADMIN)", err)
	}
	return err
}

// ownTable is a table of ours in the kernel: earlier says an earlier version made it (no owner
// comment; see judge).
type ownedTable struct {
	tableKey
	earlier bool
}

// ownTables lists the tables of ours (judge: with our owner comment, or an earlier version's) of
// families ip and ip6, sorted by family and name: what RemoveAll deletes and CleanupPlan names. A
// family that cannot be listed is an error; the other is still listed.
func (b *Ops) ownTables(ctx context.Context) ([]ownedTable, error) {
	var out []ownedTable
	var errs []error
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		tables, err := b.opts.ListTables(ctx, family)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables backend: list %s tables: %w", family, err))
			continue
		}
		sort.Slice(tables, func(i, j int) bool { return tables[i].Name < tables[j].Name })
		for _, t := range tables {
			if !strings.HasPrefix(t.Name, TablePrefix) {
				continue
			}
			o, _, err := b.judge(ctx, family, t)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if o == ownTable || o == earlierTable {
				out = append(out, ownedTable{tableKey{family: family, table: t.Name}, o == earlierTable})
			}
		}
	}
	return out, errors.Join(errs...)
}

// listExisting lists the objects of our table in the kernel, or returns nil if the table is absent.
func listExisting(ctx context.Context, nft Lister) (*existing, error) {
	objs, err := nft.ListAll(ctx)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ex := &existing{chains: objs["chain"], maps: objs["map"], sets: objs["set"], counters: objs["counter"]}
	sort.Strings(ex.chains)
	sort.Strings(ex.maps)
	sort.Strings(ex.sets)
	sort.Strings(ex.counters)
	return ex, nil
}
