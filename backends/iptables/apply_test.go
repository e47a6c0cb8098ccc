package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/connlabel"
)

type call struct {
	name  string
	args  string
	stdin string
}

// fakeRunner is a small xtables in memory, one per binary family ("iptables-nft",
// "ip6tables-legacy", …), loaded from dumps (keyed by the save binary) on first use. It answers
// iptables-save -c, iptables -t T -S CHAIN and iptables-restore --noflush (applied all or nothing,
// with the tool's "line N failed" on an input it cannot apply) and records every call. Rules are
// matched by their text, as iptables-save prints them. restoreErr fails every restore, failRestores
// the next that many, without applying them.
type fakeRunner struct {
	dumps         map[string]string
	restoreErr    error
	restoreStderr string
	failRestores  int
	calls         []call
	kernels       map[string]*xtables
}

func (f *fakeRunner) Run(_ context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	in := ""
	if stdin != nil {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, err
		}
		in = string(b)
	}
	f.calls = append(f.calls, call{name, strings.Join(args, " "), in})
	family := strings.TrimSuffix(strings.TrimSuffix(name, "-save"), "-restore")
	k, err := f.kernel(family)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasSuffix(name, "-save"):
		_, err := io.WriteString(stdout, k.save())
		return nil, err
	case strings.HasSuffix(name, "-restore"):
		if f.restoreErr != nil {
			return []byte(f.restoreStderr), f.restoreErr
		}
		if f.failRestores > 0 {
			f.failRestores--
			return []byte("iptables-restore: line 2 failed"), errors.New("exit status 1")
		}
		next := k.clone()
		if n, err := next.restore(in); err != nil {
			return []byte(fmt.Sprintf("iptables-restore: line %d failed: %v", n, err)), errors.New("exit status 1")
		}
		f.kernels[family] = next
		return nil, nil
	}
	if len(args) == 6 && args[2] == "-t" && args[4] == "-S" {
		out, err := k.list(args[3], args[5])
		if err != nil {
			return []byte("iptables: " + err.Error()), errors.New("exit status 1")
		}
		_, err = io.WriteString(stdout, out)
		return nil, err
	}
	return nil, fmt.Errorf("fakeRunner: unexpected call %s %v", name, args)
}

func (f *fakeRunner) kernel(family string) (*xtables, error) {
	if k := f.kernels[family]; k != nil {
		return k, nil
	}
	if f.kernels == nil {
		f.kernels = map[string]*xtables{}
	}
	k := &xtables{}
	if d, ok := f.dumps[family+"-save"]; ok {
		if n, err := k.restore(d); err != nil {
			return nil, fmt.Errorf("fakeRunner: dump of %s, line %d: %w", family, n, err)
		}
	}
	f.kernels[family] = k
	return k, nil
}

// xtables holds tables in the order they appeared, each with its chains in order.
type xtables struct{ tables []*xtTable }

type xtTable struct {
	name   string
	chains []*xtChain
}

type xtChain struct {
	name, policy, counters string
	rules                  []xtRule
}

type xtRule struct{ counters, spec string }

func (k *xtables) clone() *xtables {
	c := &xtables{}
	for _, t := range k.tables {
		ct := &xtTable{name: t.name}
		for _, ch := range t.chains {
			cc := *ch
			cc.rules = slices.Clone(ch.rules)
			ct.chains = append(ct.chains, &cc)
		}
		c.tables = append(c.tables, ct)
	}
	return c
}

func (k *xtables) table(name string) *xtTable {
	for _, t := range k.tables {
		if t.name == name {
			return t
		}
	}
	t := &xtTable{name: name}
	for _, c := range builtins[name] {
		t.chains = append(t.chains, &xtChain{name: c, policy: "ACCEPT", counters: "[0:0]"})
	}
	k.tables = append(k.tables, t)
	return t
}

// builtins are the chains a table has from the moment it is used.
var builtins = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"mangle": {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"},
	"raw":    {"PREROUTING", "OUTPUT"},
}

func (t *xtTable) chain(name string) *xtChain {
	for _, c := range t.chains {
		if c.name == name {
			return c
		}
	}
	return nil
}

// restore applies iptables-save/iptables-restore --noflush text: declaring a chain creates it or
// flushes it. It returns the number of the line it failed on.
func (k *xtables) restore(in string) (int, error) {
	var t *xtTable
	for i, line := range strings.Split(in, "\n") {
		n := i + 1
		if line == "" || strings.HasPrefix(line, "#") || line == "COMMIT" {
			continue
		}
		if name, ok := strings.CutPrefix(line, "*"); ok {
			t = k.table(name)
			continue
		}
		if t == nil {
			return n, errors.New("no table")
		}
		if decl, ok := strings.CutPrefix(line, ":"); ok {
			f := strings.Fields(decl)
			if len(f) != 3 {
				return n, errors.New("bad chain declaration")
			}
			if c := t.chain(f[0]); c != nil {
				c.policy, c.counters, c.rules = f[1], f[2], nil
				continue
			}
			t.chains = append(t.chains, &xtChain{name: f[0], policy: f[1], counters: f[2]})
			continue
		}
		counters := "[0:0]"
		if strings.HasPrefix(line, "[") {
			counters, line, _ = strings.Cut(line, " ")
		}
		op, rest, _ := strings.Cut(line, " ")
		name, spec, _ := strings.Cut(rest, " ")
		c := t.chain(name)
		if c == nil {
			return n, fmt.Errorf("no chain %s", name)
		}
		switch op {
		case "-A":
			c.rules = append(c.rules, xtRule{counters, spec})
		case "-I":
			pos, after, _ := strings.Cut(spec, " ")
			p, err := strconv.Atoi(pos)
			if err != nil || p < 1 || p > len(c.rules)+1 {
				return n, fmt.Errorf("bad position %q", pos)
			}
			c.rules = slices.Insert(c.rules, p-1, xtRule{counters, after})
		case "-D":
			i := slices.IndexFunc(c.rules, func(r xtRule) bool { return r.spec == spec })
			if i < 0 {
				return n, errors.New("no such rule")
			}
			c.rules = slices.Delete(c.rules, i, i+1)
		case "-F":
			c.rules = nil
		case "-X":
			if c.policy != "-" || len(c.rules) > 0 {
				return n, fmt.Errorf("cannot delete chain %s", name)
			}
			t.chains = slices.DeleteFunc(t.chains, func(x *xtChain) bool { return x == c })
		default:
			return n, fmt.Errorf("unknown command %s", op)
		}
	}
	return 0, nil
}

func (k *xtables) save() string {
	var b strings.Builder
	b.WriteString("# Generated by fakeRunner\n")
	for _, t := range k.tables {
		fmt.Fprintf(&b, "*%s\n", t.name)
		for _, c := range t.chains {
			fmt.Fprintf(&b, ":%s %s %s\n", c.name, c.policy, c.counters)
		}
		for _, c := range t.chains {
			for _, r := range c.rules {
				fmt.Fprintf(&b, "%s -A %s %s\n", r.counters, c.name, r.spec)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

func (k *xtables) list(table, chain string) (string, error) {
	c := k.table(table).chain(chain)
	if c == nil {
		return "", errors.New("No chain/target/match by that name.")
	}
	var b strings.Builder
	if c.policy == "-" {
		fmt.Fprintf(&b, "-N %s\n", c.name)
	} else {
		fmt.Fprintf(&b, "-P %s %s\n", c.name, c.policy)
	}
	for _, r := range c.rules {
		fmt.Fprintf(&b, "-A %s %s\n", c.name, r.spec)
	}
	return b.String(), nil
}

func (f *fakeRunner) restores() []call {
	var out []call
	for _, c := range f.calls {
		if strings.HasSuffix(c.name, "-restore") {
			out = append(out, c)
		}
	}
	return out
}

const emptyFilter = `# Generated by iptables-save v1.8.9
*filter
:INPUT ACCEPT [10:1000]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
[5:300] -A INPUT -p tcp -m tcp --dport 9999 -m comment --comment "foreign rule" -j ACCEPT
COMMIT
`

func TestApplyExactInput(t *testing.T) {
	for _, tc := range []struct {
		variant Variant
		family  rules.Family
		wait    int
		save    string
		restore string
		args    string
	}{
		{NFT, rules.IPv4, 0, "iptables-nft-save", "iptables-nft-restore", "-w 5 --noflush"},
		{Legacy, rules.IPv6, 7, "ip6tables-legacy-save", "ip6tables-legacy-restore", "-w 7 --noflush"},
	} {
		t.Run(string(tc.variant)+"-"+string(tc.family), func(t *testing.T) {
			f := &fakeRunner{dumps: map[string]string{tc.save: emptyFilter}}
			b := mustBackend(t, Options{Variant: tc.variant, LockWait: tc.wait, Runner: f})
			rs := invalidDrop(tc.family)
			if err := apply(context.Background(), b, rs); err != nil {
				t.Fatal(err)
			}
			want := []call{
				{tc.save, "-c", ""},
				{tc.restore, tc.args, `*filter
:NNM-INVALID-INPUT - [0:0]
-A NNM-INVALID-INPUT -m conntrack --ctstate INVALID -m comment --comment "invalid-drop/dropped: drop INVALID so the node sends no RST" -j DROP
-I INPUT 1 -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT
COMMIT
`},
				{tc.save, "-c", ""},
			}
			if diff := cmp.Diff(want, f.calls, cmp.AllowUnexported(call{})); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			// Same rendering, trusting the record: nothing runs.
			f.calls = nil
			if err := apply(context.Background(), b, rs); err != nil {
				t.Fatal(err)
			}
			if len(f.calls) != 0 {
				t.Errorf("no-op Trust reconcile ran %v, want nothing", f.calls)
			}
			// Verifying without a generation (this runner has none): one iptables-save, nothing else.
			if ok, err := inSync(context.Background(), b, rs); !ok || err != nil {
				t.Fatalf("Verify = %v, %v", ok, err)
			}
			if len(f.calls) != 1 || !strings.HasSuffix(f.calls[0].name, "-save") {
				t.Errorf("no-op Verify ran %v, want one iptables-save", f.calls)
			}
		})
	}
}

// A kernel that holds the jump already, a stale chain of the fix (with a sub-chain) and a chain of
// another fix: the jump is kept, the stale chains go, the other fix's chain stays.
const staleDump = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:NNM-INVALID-INPUT - [0:0]
:NNM-OLD - [0:0]
:NNM-OLD-SUB - [0:0]
:NNM-OTHER - [0:0]
:KUBE-FORWARD - [0:0]
[1:2] -A INPUT -m comment --comment "network-node-manager:other" -j NNM-OTHER
[1:2] -A INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT
[0:0] -A FORWARD -m comment --comment "network-node-manager:invalid-drop" -j NNM-OLD
[0:0] -A FORWARD -j KUBE-FORWARD
[0:0] -A KUBE-FORWARD -j NNM-OLD-SUB
[0:0] -A NNM-OLD -p tcp -m comment --comment "invalid-drop: it\'s \"old\"" -j NNM-OLD-SUB
[0:0] -A NNM-OLD-SUB -j DROP
[0:0] -A NNM-OTHER -j ACCEPT
COMMIT
`

func TestApplyRemovesStaleKeepsJumps(t *testing.T) {
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": staleDump}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	if err := apply(context.Background(), b, invalidDrop(rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	r := f.restores()
	if len(r) != 1 {
		t.Fatalf("%d restores, want 1", len(r))
	}
	want := `*filter
:NNM-INVALID-INPUT - [0:0]
-A NNM-INVALID-INPUT -m conntrack --ctstate INVALID -m comment --comment "invalid-drop/dropped: drop INVALID so the node sends no RST" -j DROP
-D FORWARD -m comment --comment "network-node-manager:invalid-drop" -j NNM-OLD
-D KUBE-FORWARD -j NNM-OLD-SUB
-F NNM-OLD
-F NNM-OLD-SUB
-X NNM-OLD
-X NNM-OLD-SUB
COMMIT
`
	if diff := cmp.Diff(want, r[0].stdin); diff != "" {
		t.Errorf("restore input (-want +got):\n%s", diff)
	}
}

func TestApplyRefusesAnotherFixsChain(t *testing.T) {
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": staleDump}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	rs := invalidDrop(rules.IPv4)
	rs.Fix = "thief"
	rs.Chains[0].Name = "OTHER"
	err := apply(context.Background(), b, rs)
	if err == nil || !strings.Contains(err.Error(), "already used by fix other") {
		t.Fatalf("Apply = %v, want a conflict with fix other", err)
	}
	if len(f.restores()) != 0 {
		t.Error("conflicting Apply ran iptables-restore")
	}
}

func TestApplyErrorKeepsRecord(t *testing.T) {
	f := &fakeRunner{dumps: map[string]string{"iptables-legacy-save": emptyFilter}}
	b := mustBackend(t, Options{Variant: Legacy, Runner: f})
	ctx := context.Background()
	good := invalidDrop(rules.IPv4)
	if err := apply(ctx, b, good); err != nil {
		t.Fatal(err)
	}
	f.restoreErr = errors.New("exit status 1")
	f.restoreStderr = "iptables-restore: line 3 failed\n"
	bad := invalidDrop(rules.IPv4)
	bad.Chains[0].Rules[0].Verdict = rules.Verdict{Kind: rules.Accept}
	err := apply(ctx, b, bad)
	if err == nil {
		t.Fatal("Apply succeeded although iptables-restore failed")
	}
	for _, want := range []string{"iptables-legacy-restore", "line 3 failed", "input line 3: -A NNM-INVALID-INPUT", "-j ACCEPT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// The kernel still holds the good rules, and the backend still knows it.
	if ok, err := inSync(ctx, b, good); !ok || err != nil {
		t.Errorf("in sync = %v, %v after a failed Apply; want true", ok, err)
	}
	f.calls = nil
	if err := apply(ctx, b, good); err != nil || len(f.restores()) != 0 {
		t.Errorf("re-Apply of the good ruleset = %v with %d restores; want a no-op", err, len(f.restores()))
	}
}

func TestRemoveWithoutMemory(t *testing.T) {
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": staleDump}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	if err := remove(context.Background(), b, "invalid-drop", rules.IPv4); err != nil {
		t.Fatal(err)
	}
	want := `*filter
-D INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT
-D FORWARD -m comment --comment "network-node-manager:invalid-drop" -j NNM-OLD
-D KUBE-FORWARD -j NNM-OLD-SUB
-F NNM-INVALID-INPUT
-F NNM-OLD
-F NNM-OLD-SUB
-X NNM-INVALID-INPUT
-X NNM-OLD
-X NNM-OLD-SUB
COMMIT
`
	r := f.restores()
	if len(r) != 1 {
		t.Fatalf("%d restores, want 1", len(r))
	}
	if diff := cmp.Diff(want, r[0].stdin); diff != "" {
		t.Errorf("restore input (-want +got):\n%s", diff)
	}
	// Nothing of the fix there: no restore at all.
	f.calls = nil
	if err := remove(context.Background(), b, "absent", rules.IPv4); err != nil || len(f.restores()) != 0 {
		t.Errorf("Remove of an absent fix = %v with %d restores", err, len(f.restores()))
	}
}

func TestCountersSumExpandedRules(t *testing.T) {
	dump := `*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:NNM-EXTIP-PREROUTING - [0:0]
:NNM-EXTIP-DNAT - [0:0]
:NNM-EXTIP-MASQ - [0:0]
[0:0] -A PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING
[0:0] -A POSTROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-MASQ
[9:900] -A NNM-EXTIP-PREROUTING -s 10.244.0.0/16 -m comment --comment "ipvs-externalip-dnat: from local pods" -j NNM-EXTIP-DNAT
[3:300] -A NNM-EXTIP-DNAT -d 203.0.113.10/32 -p tcp -m tcp --dport 80 -m comment --comment "ipvs-externalip-dnat/dnat: default/web:http" -j DNAT --to-destination 10.96.0.10:80
[4:400] -A NNM-EXTIP-DNAT -d 203.0.113.10/32 -p tcp -m tcp --dport 443 -m comment --comment "ipvs-externalip-dnat/dnat: default/web:\"https\"" -j DNAT --to-destination 10.96.0.10:443
[2:120] -A NNM-EXTIP-MASQ -m mark --mark 0x8000/0x8000 -m comment --comment "ipvs-externalip-dnat/masqueraded: masquerade what we DNATed" -j MASQUERADE
[7:700] -A NNM-EXTIP-MASQ -m comment --comment "other-fix/dnat: not ours" -j MASQUERADE
COMMIT
`
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": dump}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	got, err := b.Counters(context.Background(), "ipvs-externalip-dnat", rules.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]backend.Counter{"dnat": {Packets: 7, Bytes: 700}, "masqueraded": {Packets: 2, Bytes: 120}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}

func TestCleanupExactInput(t *testing.T) {
	dump4 := `*mangle
:PREROUTING ACCEPT [0:0]
:NMANAGER_MARK - [0:0]
[0:0] -A PREROUTING -j NMANAGER_MARK
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:NNM-EXTIP-PREROUTING - [0:0]
[0:0] -A PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING
[0:0] -A PREROUTING -j KUBE-SERVICES
COMMIT
` + staleDump
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": dump4, "ip6tables-nft-save": emptyFilter}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := f.restores()
	if len(r) != 1 || r[0].name != "iptables-nft-restore" {
		t.Fatalf("restores %v, want one for IPv4 only", r)
	}
	want := `*mangle
-D PREROUTING -j NMANAGER_MARK
-F NMANAGER_MARK
-X NMANAGER_MARK
COMMIT
*filter
-D INPUT -m comment --comment "network-node-manager:other" -j NNM-OTHER
-D INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT
-D FORWARD -m comment --comment "network-node-manager:invalid-drop" -j NNM-OLD
-D KUBE-FORWARD -j NNM-OLD-SUB
-F NNM-INVALID-INPUT
-F NNM-OLD
-F NNM-OLD-SUB
-F NNM-OTHER
-X NNM-INVALID-INPUT
-X NNM-OLD
-X NNM-OLD-SUB
-X NNM-OTHER
COMMIT
*nat
-D PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING
-F NNM-EXTIP-PREROUTING
-X NNM-EXTIP-PREROUTING
COMMIT
`
	if diff := cmp.Diff(want, r[0].stdin); diff != "" {
		t.Errorf("restore input (-want +got):\n%s", diff)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Options{Variant: "iptables"}); err == nil {
		t.Error("New accepted an unknown variant")
	}
	if _, err := New(Options{Variant: NFT, LockWait: -1}); err == nil {
		t.Error("New accepted a negative lock wait")
	}
	b := mustBackend(t, Options{Variant: Legacy})
	if b.Name() != "iptables" || opsOf(b).Binary(rules.IPv6, "restore") != "ip6tables-legacy-restore" {
		t.Errorf("Name %q, binary %q", b.Name(), opsOf(b).Binary(rules.IPv6, "restore"))
	}
}

// TestParseSaveSkipsGarbage: lines that are no iptables-save rule are left out and counted, never
// an error that would fail every unit of the family (issue #41 row 6); the lines around them count.
func TestParseSaveSkipsGarbage(t *testing.T) {
	for _, in := range []string{"-A INPUT -j ACCEPT\n", "*filter\n-A NOPE -j ACCEPT\n", "*filter\n:INPUT ACCEPT [0:0]\n[1:x] -A INPUT\n", "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"open\n"} {
		d, err := parseSave(in + "*nat\n:NNM-X - [0:0]\n-A NNM-X -j DROP\nCOMMIT\n")
		if err != nil {
			t.Errorf("parseSave(%q): %v", in, err)
			continue
		}
		if d.unparsed != 1 || d.firstUnparsed == "" {
			t.Errorf("parseSave(%q): %d lines left out (%q), want 1", in, d.unparsed, d.firstUnparsed)
		}
		if c := d.chain(tchain{"nat", "NNM-X"}); c == nil || c.n != 1 {
			t.Errorf("parseSave(%q): the nat table after it is %+v", in, d.table("nat"))
		}
	}
}

// TestApplyRewritesOnlyChangedBucket: once this process has applied a fix, a change of one map entry
// runs no iptables-save and one restore that rewrites only that entry's bucket, then lists it.
// appliedOnFake is an NFT backend over a fake iptables (empty but for the filter table) that has
// applied rs, with the fake's call log cleared: where a test of the next Apply starts.
func appliedOnFake(t *testing.T, rs *rules.Ruleset) (*fakeRunner, *Backend) {
	t.Helper()
	f := &fakeRunner{dumps: map[string]string{"iptables-nft-save": emptyFilter}}
	b := mustBackend(t, Options{Variant: NFT, Runner: f})
	if err := apply(context.Background(), b, rs); err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	return f, b
}

// withSecondEntry is externalIPSharded with a second entry beside its second one (IPv4: 198.51.100.8
// beside .7), whose bucket then is a chain of its own (a bucket of one rule is inlined into the
// chain that lists it).
func withSecondEntry(rs *rules.Ruleset) *rules.Ruleset {
	e := rs.Maps[0].Entries[1]
	e.Addr, e.Comment = e.Addr.Next(), "default/d:http"
	rs.Maps[0].Entries = append(rs.Maps[0].Entries, e)
	return rs
}

// TestApplyRewritesOnlyChangedBucket: a change of an entry rewrites its bucket alone, with one
// restore and a listing of that chain; of an inlined bucket's entry, the chain that lists it.
func TestApplyRewritesOnlyChangedBucket(t *testing.T) {
	ctx := context.Background()
	oneRun := func(second bool) *rules.Ruleset { // one lookup run (mark, DNAT, unmark) over two buckets
		rs := externalIPSharded(rules.IPv4)
		rs.Chains[2].Rules = rs.Chains[2].Rules[:3]
		if second {
			return withSecondEntry(rs)
		}
		return rs
	}
	label, err := connlabel.Bit(oneRun(false).Fix, "external-ips")
	if err != nil {
		t.Fatal(err)
	}
	dnat := func(chain, addr, comment, to string) string {
		return "-A " + chain + " -d " + addr + "/32 -p tcp -m tcp --dport 80 -m connlabel --label " + strconv.Itoa(label) +
			` --set -m comment --comment "ipvs-externalip-dnat/dnat: ` + comment + `" -j DNAT --to-destination ` + to + "\n"
	}
	for _, c := range []struct {
		name   string
		second bool
		chain  string
		rules  string
	}{
		{"bucket", true, "NNM-EXTIP-DNAT-C6336400",
			dnat("NNM-EXTIP-DNAT-C6336400", "198.51.100.7", "default/c:http", "10.96.0.99:80") + dnat("NNM-EXTIP-DNAT-C6336400", "198.51.100.8", "default/d:http", "10.96.0.13:80")},
		{"inlined", false, "NNM-EXTIP-DNAT", `-A NNM-EXTIP-DNAT -m comment --comment "ipvs-externalip-dnat: mark for masquerade" -j MARK --or-mark 0x8000
` + dnat("NNM-EXTIP-DNAT", "198.51.100.7", "default/c:http", "10.96.0.99:80") + `-A NNM-EXTIP-DNAT -d 203.0.113.0/28 -j NNM-EXTIP-DNAT-CB007100
-A NNM-EXTIP-DNAT -d 203.0.113.192/28 -j NNM-EXTIP-DNAT-CB0071C0
-A NNM-EXTIP-DNAT -m comment --comment "ipvs-externalip-dnat: not DNATed" -j MARK --and-mark 0xffff7fff
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := oneRun(c.second)
			if !c.second { // the other buckets keep chains of their own
				rs.Maps[0].Entries = append(rs.Maps[0].Entries, rules.MapEntry{Addr: netip.MustParseAddr("203.0.113.6"), Protocol: rules.TCP, Port: 443, To: netip.MustParseAddrPort("10.96.0.11:443")},
					rules.MapEntry{Addr: netip.MustParseAddr("203.0.113.201"), Protocol: rules.TCP, Port: 80, To: netip.MustParseAddrPort("10.96.0.12:80")})
			}
			f, b := appliedOnFake(t, rs)
			changed := oneRun(c.second)
			changed.Maps[0].Entries = slices.Clone(rs.Maps[0].Entries)
			changed.Maps[0].Entries[1].To = netip.MustParseAddrPort("10.96.0.99:80") // 198.51.100.7
			if err := apply(ctx, b, changed); err != nil {
				t.Fatal(err)
			}
			want := []call{
				{name: "iptables-nft-restore", args: "-w 5 --noflush", stdin: "*nat\n:" + c.chain + " - [0:0]\n" + c.rules + "COMMIT\n"},
				{name: "iptables-nft", args: "-w 5 -t nat -S " + c.chain},
			}
			if diff := cmp.Diff(want, f.calls, cmp.AllowUnexported(call{})); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestApplyRemovesEmptiedBucket: when the last entries of a bucket go, the parent chain loses its
// dispatch rule (it is rewritten, the other buckets' one rule each inlined as before) and the
// bucket chain is deleted, in one restore and without a save;
// the masquerade, one label match whatever the entries, is left as it is.
func TestApplyRemovesEmptiedBucket(t *testing.T) {
	ctx := context.Background()
	f, b := appliedOnFake(t, withSecondEntry(externalIPSharded(rules.IPv4)))
	changed := externalIPSharded(rules.IPv4)
	changed.Maps[0].Entries = append(changed.Maps[0].Entries[:1], changed.Maps[0].Entries[2:]...) // 198.51.100.7 and .8
	if err := apply(ctx, b, changed); err != nil {
		t.Fatal(err)
	}
	r := f.restores()
	if len(r) != 1 || len(f.calls) != 2 || f.calls[1].args != "-w 5 -t nat -S NNM-EXTIP-DNAT" {
		t.Fatalf("calls %v, want one restore and a listing of the parent chain", f.calls)
	}
	label, err := connlabel.Bit(changed.Fix, "external-ips")
	if err != nil {
		t.Fatal(err)
	}
	set := "-m connlabel --label " + strconv.Itoa(label) + " --set"
	want := `*nat
:NNM-EXTIP-DNAT - [0:0]
-A NNM-EXTIP-DNAT -m comment --comment "ipvs-externalip-dnat: mark for masquerade" -j MARK --or-mark 0x8000
-A NNM-EXTIP-DNAT -d 203.0.113.5/32 -p tcp -m tcp --dport 80 ` + set + ` -m comment --comment "ipvs-externalip-dnat/dnat: default/a:http" -j DNAT --to-destination 10.96.0.11:80
-A NNM-EXTIP-DNAT -d 203.0.113.200/32 -p tcp -m tcp --dport 443 ` + set + ` -m comment --comment "ipvs-externalip-dnat/dnat: default/b:https" -j DNAT --to-destination 10.96.0.12:443
-A NNM-EXTIP-DNAT -m comment --comment "ipvs-externalip-dnat: not DNATed" -j MARK --and-mark 0xffff7fff
-A NNM-EXTIP-DNAT -p udp -m comment --comment "ipvs-externalip-dnat: udp is not ours" -j RETURN
-A NNM-EXTIP-DNAT -d 203.0.113.0/28 -j NNM-EXTIP-DNAT2-CB007100
-A NNM-EXTIP-DNAT -d 203.0.113.192/28 -j NNM-EXTIP-DNAT2-CB0071C0
-F NNM-EXTIP-DNAT-C6336400
-F NNM-EXTIP-DNAT2-C6336400
-X NNM-EXTIP-DNAT-C6336400
-X NNM-EXTIP-DNAT2-C6336400
COMMIT
`
	if diff := cmp.Diff(want, r[0].stdin); diff != "" {
		t.Errorf("restore input (-want +got):\n%s", diff)
	}
}

// TestApplyChangedFallsBack: when the short way's restore fails (the kernel is not what the record
// says), Apply reads the kernel and applies in full.
func TestApplyChangedFallsBack(t *testing.T) {
	ctx := context.Background()
	f, b := appliedOnFake(t, externalIPSharded(rules.IPv4))
	f.failRestores = 1
	changed := externalIPSharded(rules.IPv4)
	changed.Maps[0].Entries = changed.Maps[0].Entries[1:]
	if err := apply(ctx, b, changed); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range f.calls {
		names = append(names, c.name)
	}
	if diff := cmp.Diff([]string{"iptables-nft-restore", "iptables-nft-save", "iptables-nft-restore", "iptables-nft-save"}, names); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}
