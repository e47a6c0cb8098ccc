package nftables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

func threeEntries(f rules.Family) []rules.MapEntry {
	return []rules.MapEntry{
		entry(f, 0, rules.TCP, 80, 8080),
		entry(f, 0, rules.TCP, 443, 8443),
		entry(f, 1, rules.UDP, 53, 53),
		entry(f, 2, rules.SCTP, 9000, 0), // zero keeps the port
	}
}

func TestRenderGolden(t *testing.T) {
	b := newFakeKernel().backend(t)
	for _, f := range rules.Families {
		for name, rs := range map[string]*rules.Ruleset{
			"externalip": externalIPRuleset(f, threeEntries(f)),
			"invalid":    invalidDropRuleset(f),
			"misc":       miscRuleset(f),
			"clamp":      clampRuleset(f),
		} {
			t.Run(name+"-"+string(f), func(t *testing.T) {
				got, err := b.Render(rs)
				if err != nil {
					t.Fatal(err)
				}
				golden(t, name+"-"+string(f), got)
				again, _ := b.Render(rs)
				if again != got {
					t.Fatal("Render is not deterministic")
				}
			})
		}
	}
}

// Render must be what a cold Apply sends, byte for byte, and the validating fake must accept it.
func TestRenderIsWhatColdApplySends(t *testing.T) {
	ctx := context.Background()
	for _, f := range rules.Families {
		for _, rs := range []*rules.Ruleset{externalIPRuleset(f, threeEntries(f)), invalidDropRuleset(f), miscRuleset(f), clampRuleset(f)} {
			k := newFakeKernel()
			b := k.backend(t)
			want, err := b.Render(rs)
			if err != nil {
				t.Fatal(err)
			}
			if err := apply(ctx, b, rs); err != nil {
				t.Fatalf("%s %s: %v", rs.Fix, f, err)
			}
			sent := k.rec(nftFamily(f), TableName(rs.Fix)).sentSince(0)
			if len(sent) != 1 || sent[0] != want {
				t.Fatalf("%s %s: cold Apply sent %q, Render said %q", rs.Fix, f, sent, want)
			}
		}
	}
}

func TestRenderRejects(t *testing.T) {
	b := newFakeKernel().backend(t)
	base := func() *rules.Ruleset { return miscRuleset(rules.IPv4) }
	// rejects checks that Render refuses rs with an error containing want, and Apply refuses it too.
	rejects := func(name string, rs *rules.Ruleset, want string) {
		t.Helper()
		_, err := b.Render(rs)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, want)
		}
		if err := apply(context.Background(), b, rs); err == nil {
			t.Errorf("%s: Apply accepted what Render rejects", name)
		}
	}
	for name, tc := range map[string]struct {
		mod  func(rs *rules.Ruleset)
		want string
	}{
		"invalid ruleset": {func(rs *rules.Ruleset) { rs.Fix = "Bad_Fix" }, "kebab-case"},
		"dnat port without protocol": {func(rs *rules.Ruleset) {
			rs.Chains[0].Rules[0].Match.Protocol, rs.Chains[0].Rules[0].Match.DstPort = "", 0
		}, "needs Match.Protocol"},
		"bad interface":      {func(rs *rules.Ruleset) { rs.Chains[1].Rules[1].Match.InInterfacePrefix = "eth 0" }, "interface"},
		"bad counter name":   {func(rs *rules.Ruleset) { rs.Chains[2].Rules[1].Counter = "9 lives" }, "counter name"},
		"rule does nothing":  {func(rs *rules.Ruleset) { rs.Chains[2].Rules[1] = rules.Rule{Comment: "x"} }, "neither"},
		"unknown addr type":  {func(rs *rules.Ruleset) { rs.Chains[1].Rules[2].Match.SrcAddrType = "broadcast" }, "address type"},
		"ipv6 in ipv4 table": {func(rs *rules.Ruleset) { rs.Chains[0].Rules[0].Match.DstAddr = netip.MustParseAddr("::1") }, "not ipv4"},
	} {
		rs := base()
		tc.mod(rs)
		rejects(name, rs, tc.want)
	}
	for name, tc := range map[string]struct {
		mod  func(rs *rules.Ruleset)
		want string
	}{
		"clamp without syn":      {func(rs *rules.Ruleset) { rs.Chains[0].Rules[0].Match.TCPFlags = rules.TCPFlags{} }, "SYN flag"},
		"clamp in nat":           {func(rs *rules.Ruleset) { rs.Chains[0].Type = rules.NAT }, "nat chain"},
		"pmtu clamp in input":    {func(rs *rules.Ruleset) { rs.Chains[0].Hook = rules.Input }, "path MTU"},
		"flags without tcp":      {func(rs *rules.Ruleset) { rs.Chains[0].Rules[4].Match.Protocol = rules.UDP }, "needs protocol tcp"},
		"flag set outside mask":  {func(rs *rules.Ruleset) { rs.Chains[0].Rules[4].Match.TCPFlags.Set = rules.URG }, "subset"},
		"bad output interface":   {func(rs *rules.Ruleset) { rs.Chains[0].Rules[3].Match.OutInterfacePrefix = "eth 0" }, "interface"},
		"ipv6 destination range": {func(rs *rules.Ruleset) { rs.Chains[0].Rules[1].Match.DstPrefixes[0] = pf("fd00::/8") }, "not ipv4"},
	} {
		rs := clampRuleset(rules.IPv4)
		tc.mod(rs)
		rejects(name, rs, tc.want)
	}
}

func TestApplyNoopAndElementOnlyChanges(t *testing.T) {
	ctx := context.Background()
	for _, f := range rules.Families {
		k := newFakeKernel()
		b := k.backend(t)
		entries := threeEntries(f)
		rs := externalIPRuleset(f, entries)
		if err := apply(ctx, b, rs); err != nil {
			t.Fatal(err)
		}
		rec := k.rec(nftFamily(f), TableName(rs.Fix))
		if res, err := verify(ctx, b, rs); err != nil || res.Repaired || res.Applied {
			t.Fatalf("Verify after Apply = %+v, %v; want nothing to do", res, err)
		}
		dump := k.fakes[tableKey{nftFamily(f), TableName(rs.Fix)}].Dump()

		// Same ruleset again: nothing is sent.
		n := rec.count()
		if err := apply(ctx, b, externalIPRuleset(f, threeEntries(f))); err != nil {
			t.Fatal(err)
		}
		if sent := rec.sentSince(n); len(sent) != 0 {
			t.Fatalf("re-applying the same ruleset sent %q", sent)
		}

		// One entry removed, one changed, one added: only element operations.
		changed := threeEntries(f)
		changed = changed[1:]
		changed[0].To = netip.AddrPortFrom(changed[0].To.Addr(), 9443)
		changed = append(changed, entry(f, 5, rules.TCP, 8080, 80))
		lists := rec.listCount()
		if err := apply(ctx, b, externalIPRuleset(f, changed)); err != nil {
			t.Fatal(err)
		}
		// Nothing is read first: at 10,000 elements a listing costs far more than the change.
		if got := rec.listCount() - lists; got != 0 {
			t.Fatalf("map change listed the table %d times before sending, want 0", got)
		}
		sent := rec.sentSince(n)
		if len(sent) != 1 {
			t.Fatalf("map change sent %d transactions, want 1", len(sent))
		}
		if err := onlyElementOps(sent[0]); err != nil {
			t.Fatalf("%v\nin:\n%s", err, sent[0])
		}
		// Map: delete removed, delete+add changed, add new. Companion set of keys: delete removed,
		// add new (the changed entry keeps its key, so its set element is left alone).
		if got := strings.Count(sent[0], "\n"); got != 6 {
			t.Fatalf("map change sent %d operations, want 6:\n%s", got, sent[0])
		}
		if got := strings.Count(sent[0], keySetName("external-ips")+" {"); got != 2 {
			t.Fatalf("map change sent %d operations on the companion set, want 2:\n%s", got, sent[0])
		}
		// The result equals a cold apply of the new ruleset.
		mustMatchColdApply(ctx, t, k, b, externalIPRuleset(f, changed), "after an element-only apply")
		if got := k.fakes[tableKey{nftFamily(f), TableName(rs.Fix)}].Dump(); got == dump {
			t.Fatal("map change did not change the table")
		}
	}
}

func TestApplyRewritesChangedChainsAndDeletesStaleObjects(t *testing.T) {
	ctx := context.Background()
	k, b, _ := appliedOnFake(t, miscRuleset(rules.IPv4))
	// Drop the SSH chain (and its counter), and move MISC-FORWARD to the input hook.
	rs2 := miscRuleset(rules.IPv4)
	rs2.Chains = rs2.Chains[:2]
	rs2.Chains[1].Hook = rules.Input
	rs2.Chains[1].Rules = rs2.Chains[1].Rules[:1]
	if err := apply(ctx, b, rs2); err != nil {
		t.Fatal(err)
	}
	sent := k.rec(knftables.IPv4Family, "nnm-misc").sentSince(1)
	for _, want := range []string{
		"flush chain ip nnm-misc misc-ssh\n",
		"delete chain ip nnm-misc misc-ssh\n",
		"delete chain ip nnm-misc misc-forward\n",
		"add chain ip nnm-misc misc-forward { type filter hook input priority -10 ; policy accept ; }\n",
		"delete counter ip nnm-misc cnt-ssh-dropped\n",
	} {
		if !strings.Contains(sent[0], want) {
			t.Errorf("transaction lacks %q:\n%s", want, sent[0])
		}
	}
	if strings.Contains(sent[0], "delete chain ip nnm-misc misc-prerouting") {
		t.Errorf("an unchanged chain was re-created:\n%s", sent[0])
	}
	mustMatchColdApply(ctx, t, k, b, rs2, "after the rewrite")
}

func TestVerifyRepairsTampering(t *testing.T) {
	ctx := context.Background()
	rs := invalidDropRuleset(rules.IPv6)
	_, b, fake := appliedOnFake(t, rs)
	want := fake.Dump()
	for name, change := range map[string]func(tx *knftables.Transaction){
		"flush chain":  func(tx *knftables.Transaction) { tx.Flush(&knftables.Chain{Name: "invalid-input"}) },
		"delete table": func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) },
		"add rule":     func(tx *knftables.Transaction) { tx.Add(&knftables.Rule{Chain: "probe-output", Rule: "accept"}) },
		"delete chain": func(tx *knftables.Transaction) {
			tx.Flush(&knftables.Chain{Name: "probe-output"})
			tx.Delete(&knftables.Chain{Name: "probe-output"})
		},
	} {
		tamper(ctx, t, fake, change)
		if res, err := b.Reconcile(ctx, rs.Fix, rs.Family, rs, backend.Trust); err != nil || res.Applied || res.ReadBack {
			t.Fatalf("%s: Trust = %+v, %v; want the record trusted, nothing read or sent", name, res, err)
		}
		if res, err := verify(ctx, b, rs); err != nil || !res.Repaired || !res.Applied {
			t.Fatalf("%s: Verify = %+v, %v; want a repair", name, res, err)
		}
		if got := fake.Dump(); got != want {
			t.Fatalf("%s: Verify did not restore the table:\n%s\nwant:\n%s", name, got, want)
		}
		if ok, err := inSync(ctx, b, rs); !ok || err != nil {
			t.Fatalf("%s: in sync after repair = %v, %v", name, ok, err)
		}
	}
}

func TestFailedTransactionKeepsPreviousState(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	b := k.backend(t)
	rs := externalIPRuleset(rules.IPv4, threeEntries(rules.IPv4))
	if err := apply(ctx, b, rs); err != nil {
		t.Fatal(err)
	}
	key := tableKey{knftables.IPv4Family, TableName(rs.Fix)}
	before := k.fakes[key].Dump()
	rec := k.rec(key.family, key.table)
	rec.inject = func(tx *knftables.Transaction) error {
		// A jump to a chain that does not exist: the fake (like the kernel) rejects the whole batch.
		tx.Add(&knftables.Rule{Chain: "extip-dnat", Rule: "jump nowhere"})
		return nil
	}
	err := apply(ctx, b, externalIPRuleset(rules.IPv4, threeEntries(rules.IPv4)[:1]))
	if err == nil || !strings.Contains(err.Error(), "nowhere") || !strings.Contains(err.Error(), "nnm-ipvs-externalip-dnat") {
		t.Fatalf("Apply error = %v; want one naming the table and the cause", err)
	}
	if got := k.fakes[key].Dump(); got != before {
		t.Fatalf("a failed transaction changed the table:\n%s\nwant:\n%s", got, before)
	}
	rec.inject = nil
	if err := apply(ctx, b, rs); err != nil {
		t.Fatal(err)
	}
	if ok, _ := inSync(ctx, b, rs); !ok {
		t.Fatal("not in sync after recovering")
	}
}

func TestMissingNFTIsAClearError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	b, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = apply(context.Background(), b, invalidDropRuleset(rules.IPv4))
	if err == nil || !strings.Contains(err.Error(), "nft binary not found; install nftables") {
		t.Fatalf("Apply without nft = %v", err)
	}
	// Listing tables needs no nft (netlink); removing one does. The listing is this test's, so
	// the host's own tables are never read.
	b, err = New(Options{ListTables: func(_ context.Context, f knftables.Family) ([]TableInfo, error) {
		return []TableInfo{{Name: TableName("invalid-drop"), Comment: OwnerComment("invalid-drop")}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Cleanup(context.Background()); err == nil || !strings.Contains(err.Error(), "nft binary not found") {
		t.Fatalf("Cleanup without nft = %v", err)
	}
}

func TestRemoveCountersCleanup(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	b := k.backend(t)
	for _, f := range rules.Families {
		for _, rs := range []*rules.Ruleset{invalidDropRuleset(f), miscRuleset(f)} {
			if err := apply(ctx, b, rs); err != nil {
				t.Fatal(err)
			}
		}
	}
	c, err := b.Counters(ctx, "invalid-drop", rules.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c["invalid-dropped"]; !ok || len(c) != 2 {
		t.Fatalf("Counters = %v; want invalid-dropped and probe", c)
	}
	if err := remove(ctx, b, "invalid-drop", rules.IPv4); err != nil {
		t.Fatal(err)
	}
	if err := remove(ctx, b, "invalid-drop", rules.IPv4); err != nil {
		t.Fatalf("removing an absent table: %v", err)
	}
	if c, err := b.Counters(ctx, "invalid-drop", rules.IPv4); err != nil || len(c) != 0 {
		t.Fatalf("Counters of a removed table = %v, %v", c, err)
	}
	if err := b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for key, f := range k.fakes {
		if f.Table != nil {
			t.Errorf("Cleanup left table %s %s", key.family, key.table)
		}
	}
	if err := remove(ctx, b, "Not-A-Fix", rules.IPv4); err == nil {
		t.Error("Remove accepted an invalid fix id")
	}
	if _, err := b.Counters(ctx, "x", rules.Family("ipx")); err == nil {
		t.Error("Counters accepted an unknown family")
	}
}

// sortedDump is the fake's dump with lines sorted: element order depends on insertion order.
func sortedDump(f *knftables.Fake) string {
	lines := strings.Split(f.Dump(), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// tamper runs change on the fake directly, behind the backend's back.
func tamper(ctx context.Context, t *testing.T, fake *knftables.Fake, change func(tx *knftables.Transaction)) {
	t.Helper()
	tx := fake.NewTransaction()
	change(tx)
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// mustMatchColdApply fails unless the fake kernel k holds for rs exactly what a cold Apply of rs
// makes in a fresh one (element order aside), and b finds it in sync. what names the moment.
func mustMatchColdApply(ctx context.Context, t *testing.T, k *kernel, b *Backend, rs *rules.Ruleset, what string) {
	t.Helper()
	cold := newFakeKernel()
	if err := apply(ctx, cold.backend(t), rs); err != nil {
		t.Fatal(err)
	}
	key := tableKey{nftFamily(rs.Family), TableName(rs.Fix)}
	if got, want := sortedDump(k.fakes[key]), sortedDump(cold.fakes[key]); got != want {
		t.Fatalf("%s, the table differs from a cold apply:\n%s\nwant:\n%s", what, got, want)
	}
	if ok, err := inSync(ctx, b, rs); !ok || err != nil {
		t.Fatalf("%s, not in sync (%v)", what, err)
	}
}

// appliedOnFake is a fake kernel and a backend that has applied rs, and the fake that holds rs's
// table: where a test changes, tampers or fails the next step.
func appliedOnFake(t *testing.T, rs *rules.Ruleset) (*kernel, *Backend, *knftables.Fake) {
	t.Helper()
	k := newFakeKernel()
	b := k.backend(t)
	if err := apply(context.Background(), b, rs); err != nil {
		t.Fatal(err)
	}
	return k, b, k.fakes[tableKey{nftFamily(rs.Family), TableName(rs.Fix)}]
}

// A map change whose element operations no longer fit the kernel (an element deleted behind our
// back) falls back to a rewrite within the same Apply.
func TestElementDriftFallsBackToRewrite(t *testing.T) {
	ctx := context.Background()
	f := rules.IPv4
	k, b, fake := appliedOnFake(t, externalIPRuleset(f, threeEntries(f)))
	gone := element("external-ips", threeEntries(f)[0])
	tamper(ctx, t, fake, func(tx *knftables.Transaction) { tx.Delete(&knftables.Element{Map: gone.Map, Key: gone.Key}) })
	want := threeEntries(f)[1:] // removes the element that is already gone
	if err := apply(ctx, b, externalIPRuleset(f, want)); err != nil {
		t.Fatal(err)
	}
	mustMatchColdApply(ctx, t, k, b, externalIPRuleset(f, want), "after the fallback rewrite")
}

// An element-only change does not read the table first, so a chain flushed behind our back stays
// flushed through it; a Verify reconcile (the periodic resync) notices and repairs.
func TestElementOnlyChangeLeavesRuleDriftToVerify(t *testing.T) {
	ctx := context.Background()
	f := rules.IPv4
	k, b, fake := appliedOnFake(t, externalIPRuleset(f, threeEntries(f)))
	tamper(ctx, t, fake, func(tx *knftables.Transaction) { tx.Flush(&knftables.Chain{Name: "extip-dnat"}) })
	want := threeEntries(f)[1:]
	if err := apply(ctx, b, externalIPRuleset(f, want)); err != nil {
		t.Fatal(err)
	}
	if ok, err := inSync(ctx, b, externalIPRuleset(f, want)); ok || err != nil {
		t.Fatalf("Verify after an element change over a flushed chain found it in sync (%v, %v)", ok, err)
	}
	mustMatchColdApply(ctx, t, k, b, externalIPRuleset(f, want), "after the repair")
}

// Removing a table this process never touched runs nothing when the kernel does not have it, and
// still deletes it when it does (left by an earlier process).
func TestRemoveOfUntouchedTable(t *testing.T) {
	ctx := context.Background()
	k := newFakeKernel()
	b := k.backend(t)
	if err := remove(ctx, b, "invalid-drop", rules.IPv6); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	n := len(k.tables)
	k.mu.Unlock()
	if n != 0 {
		t.Fatalf("Remove of an absent, untouched table created %d nft interfaces; want none", n)
	}

	if err := apply(ctx, b, invalidDropRuleset(rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	b2 := k.backend(t) // a restarted agent: no memory of the table
	if err := remove(ctx, b2, "invalid-drop", rules.IPv4); err != nil {
		t.Fatal(err)
	}
	if f := k.fakes[tableKey{knftables.IPv4Family, "nnm-invalid-drop"}]; f.Table != nil {
		t.Fatal("Remove from a fresh backend left the table in place")
	}
}
