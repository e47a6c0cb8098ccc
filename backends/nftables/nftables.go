// Package nftables is the nftables implementation of backend.Backend.
//
// Every fix owns one table per family, `table ip nnm-<fix>` and `table ip6 nnm-<fix>`, and nothing
// else: other owners' tables (kube-proxy, iptables-nft's ip filter/nat) are never listed, flushed or
// changed. Chains hooked into the kernel are base chains of that table; lookup maps are nft maps, so
// 10,000 Services cost one map lookup per packet and a change to one Service is one element
// operation. All kernel access goes through sigs.k8s.io/knftables, one transaction (`nft -f`) per
// Apply; the knftables.Interface factory is the seam tests replace with knftables.NewFake.
package nftables

import (
	"context"
	"encoding/json"
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
)

// Name is the backend's name as it labels metrics.
const Name = "nftables"

// Options configures New. Zero values select the real kernel and slog.Default().
type Options struct {
	Logger *slog.Logger
	// NewInterface returns the knftables interface for one table. Nil means knftables.New, which runs
	// `nft` (once at creation to check that nftables works, then once per transaction or listing).
	NewInterface func(family knftables.Family, table string) (knftables.Interface, error)
	// ListTables returns the names of all tables of one family (every owner's). Nil means
	// `nft --json list tables <family>`. Only Cleanup uses it.
	ListTables func(ctx context.Context, family knftables.Family) ([]string, error)
}

// Backend programs rulesets as nftables tables. It is safe for concurrent use.
type Backend struct {
	log          *slog.Logger
	newInterface func(family knftables.Family, table string) (knftables.Interface, error)
	listTables   func(ctx context.Context, family knftables.Family) ([]string, error)

	mu     sync.Mutex
	ifaces map[tableKey]knftables.Interface
	state  map[tableKey]*applied
}

var _ backend.Backend = (*Backend)(nil)

type tableKey struct {
	family knftables.Family
	table  string
}

// applied is what the last successful Apply of one table put into the kernel.
type applied struct {
	model *model
	// seen is the kernel's table as snapshot() saw it right after that Apply (nil if unreadable).
	seen *tableState
}

// New returns a Backend. It does no I/O: nft is first run by the first call that needs the kernel.
func New(opts Options) (*Backend, error) {
	b := &Backend{
		log:          opts.Logger,
		newInterface: opts.NewInterface,
		listTables:   opts.ListTables,
		ifaces:       map[tableKey]knftables.Interface{},
		state:        map[tableKey]*applied{},
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	b.log = b.log.With("backend", Name)
	if b.newInterface == nil {
		b.newInterface = newRealInterface
	}
	if b.listTables == nil {
		b.listTables = listRealTables
	}
	return b, nil
}

// Name is part of backend.Backend.
func (b *Backend) Name() string { return Name }

// Render returns the `nft -f` input of the transaction Apply sends when the kernel holds nothing of
// this table yet (a cold apply, or the text `plan` shows). Against an existing table Apply sends
// the same lines plus, before them, a flush of the table's chains and deletes of objects being
// re-created, and after them deletes of counters no longer wanted; see writeFull.
func (b *Backend) Render(rs *rules.Ruleset) (string, error) {
	m, err := build(rs)
	if err != nil {
		return "", err
	}
	tx := knftables.NewFake(m.family, m.table).NewTransaction()
	writeFull(tx, m, nil)
	return tx.String(), nil
}

// iface returns the (cached) knftables interface of a table. Call with b.mu held.
func (b *Backend) iface(k tableKey) (knftables.Interface, error) {
	if nft := b.ifaces[k]; nft != nil {
		return nft, nil
	}
	nft, err := b.newInterface(k.family, k.table)
	if err != nil {
		return nil, err
	}
	b.ifaces[k] = nft
	return nft, nil
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

// Apply is part of backend.Backend. When the kernel still holds what the last Apply left, it sends
// nothing for an identical ruleset and only element operations when only map entries changed;
// otherwise it sends one transaction that rewrites the table's chains and maps (named counters keep
// their values).
func (b *Backend) Apply(ctx context.Context, rs *rules.Ruleset) error {
	m, err := build(rs)
	if err != nil {
		return err
	}
	k := tableKey{family: m.family, table: m.table}
	log := b.log.With("fix", rs.Fix, "family", string(rs.Family), "table", m.table)

	b.mu.Lock()
	defer b.mu.Unlock()
	nft, err := b.iface(k)
	if err != nil {
		return err
	}

	prev := b.state[k]
	trusted := false
	if prev != nil && prev.seen != nil && sameShape(prev.model, m) {
		// Same chains and rules. When nothing changed, check the whole table (a no-op Apply must
		// also repair a deleted element). When only elements changed, send the element operations
		// without reading anything first: that is what keeps a one-Service change cheap at 10,000
		// Services (listing even the rules alone, `nft --json --terse list table`, costs ~90 ms
		// there, since nft 1.0.6 fetches the elements too, against ~5 ms for the transaction). A
		// deleted table or map, or a drifted element, makes the transaction fail, which falls back
		// to a rewrite below; a flushed chain or a changed rule is drift that InSync, called by the
		// periodic resync, finds and the engine repairs (it compares rules and elements).
		if writeElementDiff(knftables.NewFake(k.family, k.table).NewTransaction(), prev.model, m) {
			tx := nft.NewTransaction()
			writeElementDiff(tx, prev.model, m)
			err := nft.Run(ctx, tx)
			if err == nil {
				b.state[k] = &applied{model: m, seen: prev.seen.withElements(m)}
				log.Debug("applied map changes", "operations", tx.NumOperations())
				return nil
			}
			log.Info("map update failed, rewriting the table", "err", err)
		} else {
			now, err := snapshot(ctx, nft, true)
			switch {
			case err != nil:
				log.Warn("cannot read our table back; rewriting it", "err", err)
			case now.equal(prev.seen):
				log.Debug("kernel already holds the ruleset; nothing sent")
				return nil
			default:
				log.Info("table changed behind our back; rewriting it")
			}
		}
	} else if prev != nil && prev.seen != nil {
		// The chains changed; our previous chain definitions can be reused if the kernel still has
		// the objects and rules we left there (redefining a chain means deleting and re-creating it,
		// which changes the rule handles; elements do not matter here since maps are rewritten).
		now, err := snapshot(ctx, nft, false)
		trusted = err == nil && now.objects == prev.seen.objects && now.rules == prev.seen.rules
	}

	ex, err := listExisting(ctx, nft)
	if err != nil {
		return fmt.Errorf("nftables backend: list table %s %s: %w", k.family, k.table, explain(err))
	}
	if ex != nil {
		ex.trusted = trusted
		if prev != nil {
			ex.known = prev.model
		}
	}
	tx := nft.NewTransaction()
	writeFull(tx, m, ex)
	if err := nft.Run(ctx, tx); err != nil {
		// The transaction is atomic: the kernel still holds what it held before.
		delete(b.state, k)
		return fmt.Errorf("nftables backend: apply table %s %s (%d operations): %w",
			k.family, k.table, tx.NumOperations(), explain(err))
	}
	// Record what the kernel now holds. The maps hold exactly m's elements (the transaction flushed
	// and refilled them atomically), so only objects and rules, which get kernel-assigned handles, are
	// read back; that halves the cost of an Apply at 10,000 elements. The kernel tests check that
	// InSync, which lists the elements, agrees right after.
	seen, err := snapshot(ctx, nft, false)
	if err != nil {
		log.Warn("applied, but cannot read the table back; the next Apply rewrites it", "err", err)
		seen = nil
	} else {
		seen = seen.withElements(m)
	}
	b.state[k] = &applied{model: m, seen: seen}
	log.Debug("applied", "operations", tx.NumOperations())
	return nil
}

// listExisting lists the objects of our table in the kernel, or returns nil if the table is absent.
func listExisting(ctx context.Context, nft knftables.Interface) (*existing, error) {
	objs, err := nft.ListAll(ctx)
	if knftables.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ex := &existing{chains: objs["chain"], maps: objs["map"], counters: objs["counter"]}
	sort.Strings(ex.chains)
	sort.Strings(ex.maps)
	sort.Strings(ex.counters)
	return ex, nil
}

// tableState describes our table as the kernel holds it. Counter values are left out, so traffic
// does not make a table look changed.
type tableState struct {
	// objects: the names of the table's chains, maps, counters (and anything else in it).
	objects string
	// rules: see listRules.
	rules string
	// elements: per map, its sorted elements with values and comments (nil: not listed).
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

func (s *tableState) equal(o *tableState) bool {
	return s.objects == o.objects && s.rules == o.rules && s.sameElements(o)
}

// withElements is s after an element-only transaction that made the maps hold m's elements.
func (s *tableState) withElements(m *model) *tableState {
	out := &tableState{objects: s.objects, rules: s.rules, elements: map[string]string{}}
	for _, mm := range m.maps {
		els := make([]*knftables.Element, len(mm.elems))
		for i := range mm.elems {
			els[i] = &mm.elems[i]
		}
		out.elements[mm.m.Name] = elementLines(els)
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
func listRules(ctx context.Context, nft knftables.Interface) (string, error) {
	rs, err := nft.ListRules(ctx, "")
	if knftables.IsNotFound(err) {
		return "absent", nil
	}
	if err != nil {
		return "", err
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
	for _, ch := range slices.Sorted(maps.Keys(perChain)) {
		fmt.Fprintf(&sb, "chain %s: %s\n", ch, strings.Join(perChain[ch], ", "))
	}
	return sb.String(), nil
}

// snapshot lists our table: object names, rules, and (withElements) every map's elements.
func snapshot(ctx context.Context, nft knftables.Interface, withElements bool) (*tableState, error) {
	objs, err := nft.ListAll(ctx)
	if knftables.IsNotFound(err) {
		return &tableState{objects: "absent", rules: "absent"}, nil
	}
	if err != nil {
		return nil, err
	}
	var sb strings.Builder
	for _, typ := range []string{"chain", "map", "set", "counter", "flowtable"} {
		names := slices.Sorted(slices.Values(objs[typ]))
		fmt.Fprintf(&sb, "%s %s\n", typ, strings.Join(names, " "))
	}
	st := &tableState{objects: sb.String()}
	if st.rules, err = listRules(ctx, nft); err != nil {
		return nil, err
	}
	if !withElements {
		return st, nil
	}
	st.elements = map[string]string{}
	for _, name := range objs["map"] {
		els, err := nft.ListElements(ctx, "map", name)
		if err != nil {
			return nil, err
		}
		st.elements[name] = elementLines(els)
	}
	return st, nil
}

// InSync is part of backend.Backend: it lists our table and compares it with what the last
// successful Apply left there.
func (b *Backend) InSync(ctx context.Context, fix string, family rules.Family) (bool, error) {
	k, err := keyOf(fix, family)
	if err != nil {
		return false, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	prev := b.state[k]
	if prev == nil {
		return false, nil
	}
	nft, err := b.iface(k)
	if err != nil {
		return false, err
	}
	if prev.seen == nil {
		return false, nil
	}
	now, err := snapshot(ctx, nft, true)
	if err != nil {
		return false, fmt.Errorf("nftables backend: list table %s %s: %w", k.family, k.table, explain(err))
	}
	return now.equal(prev.seen), nil
}

// Remove is part of backend.Backend: it deletes the fix's table of that family.
func (b *Backend) Remove(ctx context.Context, fix string, family rules.Family) error {
	k, err := keyOf(fix, family)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state[k] == nil && b.ifaces[k] == nil {
		// A table this process never touched (the engine removes every disabled fix's tables at
		// start): one listing says whether there is anything to delete, where creating the table's
		// interface (nft --version, nft --check) and deleting would run nft three times. At start
		// this is most of the fixed cost before the first rules reach the kernel.
		if names, err := b.listTables(ctx, k.family); err == nil && !slices.Contains(names, k.table) {
			return nil
		}
	}
	return b.removeLocked(ctx, k)
}

func (b *Backend) removeLocked(ctx context.Context, k tableKey) error {
	nft, err := b.iface(k)
	if err != nil {
		return err
	}
	delete(b.state, k)
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("nftables backend: delete table %s %s: %w", k.family, k.table, explain(err))
	}
	return nil
}

// Counters is part of backend.Backend: it reads the named counters of the fix's table.
func (b *Backend) Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error) {
	k, err := keyOf(fix, family)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	nft, err := b.iface(k)
	if err != nil {
		return nil, err
	}
	out := map[string]backend.Counter{}
	if _, err := nft.List(ctx, "counter"); knftables.IsNotFound(err) {
		return out, nil // no table, no counters
	} else if err != nil {
		return nil, fmt.Errorf("nftables backend: list counters of %s %s: %w", k.family, k.table, err)
	}
	cs, err := nft.ListCounters(ctx)
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

// Cleanup is part of backend.Backend: it deletes every table named nnm-* in families ip and ip6,
// whichever fix (or process) created it.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		names, err := b.listTables(ctx, family)
		if err != nil {
			errs = append(errs, fmt.Errorf("nftables backend: list %s tables: %w", family, err))
			continue
		}
		sort.Strings(names)
		for _, name := range names {
			if !strings.HasPrefix(name, TablePrefix) {
				continue
			}
			if err := b.removeLocked(ctx, tableKey{family: family, table: name}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// newRealInterface is the default Options.NewInterface. It turns the causes users hit into errors
// that name them.
func newRealInterface(family knftables.Family, table string) (knftables.Interface, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nftables backend: nft binary not found; install nftables (%w)", err)
	}
	nft, err := knftables.New(family, table)
	if err != nil {
		return nil, fmt.Errorf("nftables backend: nftables is not usable here (kernel without nf_tables, "+
			"nft older than 1.0.1, or missing CAP_NET_ADMIN): %w", err)
	}
	return nft, nil
}

// listRealTables is the default Options.ListTables.
func listRealTables(ctx context.Context, family knftables.Family) ([]string, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("nftables backend: nft binary not found; install nftables (%w)", err)
	}
	out, err := exec.CommandContext(ctx, path, "--json", "list", "tables", string(family)).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("nft list tables %s: %w: %s", family, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("nft list tables %s: %w", family, err)
	}
	var doc struct {
		Nftables []struct {
			Table *struct {
				Family string `json:"family"`
				Name   string `json:"name"`
			} `json:"table"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parse nft list tables %s: %w", family, err)
	}
	var names []string
	for _, o := range doc.Nftables {
		if o.Table != nil && o.Table.Family == string(family) {
			names = append(names, o.Table.Name)
		}
	}
	return names, nil
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
