package testkit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

var ctx = context.Background()

func goodRuleset(fix string, fam rules.Family) *rules.Ruleset {
	cidr := netip.MustParsePrefix("10.244.0.0/16")
	ext, to := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddrPort("10.96.0.10:80")
	if fam == rules.IPv6 {
		cidr = netip.MustParsePrefix("fd00:10:244::/64")
		ext, to = netip.MustParseAddr("2001:db8::10"), netip.MustParseAddrPort("[fd00:10:96::10]:80")
	}
	return &rules.Ruleset{
		Fix: fix, Family: fam,
		Chains: []rules.Chain{
			{Name: "DNAT", Type: rules.NAT, Rules: []rules.Rule{
				{Match: rules.Match{Lookup: "svc"}, SetMark: 0x400000},
				{Match: rules.Match{Lookup: "svc"}, Verdict: rules.Verdict{Kind: rules.DNATLookup}},
			}},
			{Name: "POST", Type: rules.NAT, Hook: rules.Postrouting, Rules: []rules.Rule{
				{Match: rules.Match{Mark: 0x400000}, Verdict: rules.Verdict{Kind: rules.Masquerade}},
			}},
			{Name: "PRE", Type: rules.NAT, Hook: rules.Prerouting, Rules: []rules.Rule{
				{Match: rules.Match{SrcPrefixes: []netip.Prefix{cidr}}, Verdict: rules.Verdict{Kind: rules.Jump, Chain: "DNAT"}, Counter: "pods", Comment: "from pods"},
			}},
		},
		Maps: []rules.Map{{Name: "svc", Entries: []rules.MapEntry{{Addr: ext, Protocol: rules.TCP, Port: 80, To: to, Comment: "default/web:http"}}}},
	}
}

func TestFormat(t *testing.T) {
	Golden(t, "testdata/format.golden", Format(goodRuleset("demo-fix", rules.IPv4))+Format(goodRuleset("demo-fix", rules.IPv6))+Format(nil))
}

func TestFakeAcceptsAndDumps(t *testing.T) {
	f := NewFakeBackend()
	for _, fam := range rules.Families {
		if err := Apply(ctx, f, goodRuleset("demo-fix", fam)); err != nil {
			t.Fatalf("Apply %s: %v", fam, err)
		}
	}
	if err := Apply(ctx, f, &rules.Ruleset{Fix: "another", Family: rules.IPv4}); err != nil {
		t.Fatal(err)
	}
	Golden(t, "testdata/dump.golden", f.Dump())
	rs := goodRuleset("demo-fix", rules.IPv4)
	for _, mode := range []backend.Mode{backend.Trust, backend.Verify} {
		if res, err := f.Reconcile(ctx, "demo-fix", rules.IPv4, rs, mode); err != nil || res.Applied || res.Repaired {
			t.Errorf("%s of what the record holds = %+v, %v; want nothing done", mode, res, err)
		}
	}
	f.Tamper("demo-fix", rules.IPv4)
	if res, err := f.Reconcile(ctx, "demo-fix", rules.IPv4, rs, backend.Trust); err != nil || res.Applied || res.ReadBack {
		t.Errorf("Trust after Tamper = %+v, %v; want the record trusted", res, err)
	}
	if res, err := f.Reconcile(ctx, "demo-fix", rules.IPv4, rs, backend.Verify); err != nil || !res.Applied || !res.Repaired || !res.ReadBack {
		t.Errorf("Verify after Tamper = %+v, %v; want a repair", res, err)
	}
	if f.ApplyCalls() != 4 || f.ReadBacks() != 2 {
		t.Errorf("ApplyCalls = %d, ReadBacks = %d; want 4 and 2", f.ApplyCalls(), f.ReadBacks())
	}
	if err := Remove(ctx, f, "demo-fix", rules.IPv6); err != nil {
		t.Fatal(err)
	}
	if res, err := f.Reconcile(ctx, "demo-fix", rules.IPv6, nil, backend.Trust); err != nil || res.Applied {
		t.Fatalf("second removal: %+v, %v", res, err)
	}
	if f.Ruleset("demo-fix", rules.IPv6) != nil || f.Ruleset("demo-fix", rules.IPv4) == nil {
		t.Error("Remove removed the wrong family")
	}
	if err := f.Cleanup(ctx); err != nil || f.Dump() != "" {
		t.Errorf("after Cleanup: err=%v dump=%q", err, f.Dump())
	}
}

func TestFakeRejects(t *testing.T) {
	mod := func(m func(rs *rules.Ruleset)) *rules.Ruleset {
		rs := goodRuleset("demo-fix", rules.IPv4)
		m(rs)
		return rs
	}
	cases := []struct {
		name string
		rs   *rules.Ruleset
		want string
	}{
		{"jump to missing chain", mod(func(rs *rules.Ruleset) { rs.Chains[2].Rules[0].Verdict.Chain = "NOPE" }), "missing chain"},
		{"lookup missing map", mod(func(rs *rules.Ruleset) { rs.Maps = nil }), "missing map"},
		{"wrong family", mod(func(rs *rules.Ruleset) { rs.Family = rules.IPv6 }), "is not ipv6"},
		{"jump across tables", mod(func(rs *rules.Ruleset) { rs.Chains[0].Type = rules.Filter; rs.Chains[0].Rules = nil }), "jump from a nat chain to filter chain"},
		{"masquerade from prerouting", mod(func(rs *rules.Ruleset) {
			rs.Chains[0].Rules = append(rs.Chains[0].Rules, rules.Rule{Verdict: rules.Verdict{Kind: rules.Masquerade}})
		}), "masquerade is only valid from postrouting"},
		{"dnat from postrouting", mod(func(rs *rules.Ruleset) {
			rs.Chains[1].Rules = append(rs.Chains[1].Rules, rules.Rule{Verdict: rules.Verdict{Kind: rules.Jump, Chain: "DNAT"}})
		}), "dnat is only valid from prerouting or output"},
		{"jump loop", mod(func(rs *rules.Ruleset) {
			rs.Chains = append(rs.Chains, rules.Chain{Name: "LOOP", Type: rules.NAT, Rules: []rules.Rule{{Verdict: rules.Verdict{Kind: rules.Jump, Chain: "DNAT"}}}})
			rs.Chains[0].Rules = append([]rules.Rule{{Verdict: rules.Verdict{Kind: rules.Jump, Chain: "LOOP"}}}, rs.Chains[0].Rules...)
		}), "jump loop PRE -> DNAT -> LOOP -> DNAT"},
		{"path-MTU clamp reached from prerouting", &rules.Ruleset{Fix: "demo-fix", Family: rules.IPv4, Chains: []rules.Chain{
			{Name: "PRE", Type: rules.Mangle, Hook: rules.Prerouting, Rules: []rules.Rule{{Verdict: rules.Verdict{Kind: rules.Jump, Chain: "CLAMP"}}}},
			{Name: "CLAMP", Type: rules.Mangle, Rules: []rules.Rule{{Match: rules.Match{Protocol: rules.TCP, TCPFlags: rules.SYNNotRST}, Verdict: rules.Verdict{Kind: rules.ClampMSS}}}},
		}}, "clamping the MSS to the path MTU is only valid from forward, output or postrouting"},
		{"clamp without a SYN match", &rules.Ruleset{Fix: "demo-fix", Family: rules.IPv4, Chains: []rules.Chain{
			{Name: "FWD", Type: rules.Mangle, Hook: rules.Forward, Rules: []rules.Rule{{Match: rules.Match{Protocol: rules.TCP}, Verdict: rules.Verdict{Kind: rules.ClampMSS, MSS: 1300}}}},
		}}, "SYN flag"},
		{"output interface in input", &rules.Ruleset{Fix: "demo-fix", Family: rules.IPv4, Chains: []rules.Chain{
			{Name: "IN", Type: rules.Filter, Hook: rules.Input, Rules: []rules.Rule{{Match: rules.Match{OutInterfacePrefix: "eth"}, Verdict: rules.Verdict{Kind: rules.Drop}}}},
		}}, "output interface match in a input chain"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFakeBackend()
			err := Apply(ctx, f, tc.rs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply error = %v, want one containing %q", err, tc.want)
			}
			if _, err := f.Render(tc.rs); err == nil {
				t.Error("Render accepted what Apply rejected")
			}
			if f.Dump() != "" || f.FailedApplies() != 1 {
				t.Errorf("a rejected Apply changed the state: %q (failed=%d)", f.Dump(), f.FailedApplies())
			}
		})
	}
}

func TestFakeChainNameClashBetweenFixes(t *testing.T) {
	f := NewFakeBackend()
	if err := Apply(ctx, f, goodRuleset("first-fix", rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	err := Apply(ctx, f, goodRuleset("second-fix", rules.IPv4))
	if err == nil || !strings.Contains(err.Error(), "owned by fix first-fix") {
		t.Fatalf("clash not rejected: %v", err)
	}
	// Other family and the same fix again are fine.
	if err := Apply(ctx, f, goodRuleset("second-fix", rules.IPv6)); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, f, goodRuleset("first-fix", rules.IPv4)); err != nil {
		t.Fatal(err)
	}
}

func TestFakeAtomicity(t *testing.T) {
	f := NewFakeBackend()
	good := goodRuleset("demo-fix", rules.IPv4)
	if err := Apply(ctx, f, good); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	bad := goodRuleset("demo-fix", rules.IPv4)
	bad.Chains[2].Rules = append(bad.Chains[2].Rules, rules.Rule{Verdict: rules.Verdict{Kind: rules.Jump, Chain: "MISSING"}})
	if err := Apply(ctx, f, bad); err == nil {
		t.Fatal("bad ruleset accepted")
	}
	if got := f.Dump(); got != before {
		t.Errorf("state changed by a failed Apply:\n%s", got)
	}
	// Injected error: same guarantee.
	injected := errors.New("iptables-restore: exit status 4")
	f.SetApplyError(injected)
	if err := Apply(ctx, f, &rules.Ruleset{Fix: "demo-fix", Family: rules.IPv4}); !errors.Is(err, injected) {
		t.Fatalf("Apply = %v, want the injected error", err)
	}
	if f.Dump() != before {
		t.Error("state changed by an Apply with injected error")
	}
	f.SetApplyError(nil)
	// The fake keeps a copy: mutating the caller's ruleset changes nothing.
	good.Chains[0].Rules[0].Comment = "mutated"
	good.Chains[2].Rules[0].Match.SrcPrefixes[0] = netip.MustParsePrefix("192.0.2.0/24")
	if f.Dump() != before {
		t.Error("fake shares memory with the applied ruleset")
	}
	if f.ApplyCalls() != 3 || f.FailedApplies() != 2 {
		t.Errorf("calls=%d failed=%d, want 3 and 2", f.ApplyCalls(), f.FailedApplies())
	}
}

func TestFakeCounters(t *testing.T) {
	f := NewFakeBackend()
	if _, err := f.Counters(ctx, "demo-fix", rules.IPv4); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("Counters before Apply: %v", err)
	}
	if err := Apply(ctx, f, goodRuleset("demo-fix", rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	if err := f.SetCounter("demo-fix", rules.IPv4, "nope", backend.Counter{}); err == nil {
		t.Error("SetCounter accepted an unknown counter")
	}
	if err := f.SetCounter("demo-fix", rules.IPv4, "pods", backend.Counter{Packets: 3, Bytes: 180}); err != nil {
		t.Fatal(err)
	}
	cs, err := f.Counters(ctx, "demo-fix", rules.IPv4)
	if err != nil || cs["pods"] != (backend.Counter{Packets: 3, Bytes: 180}) || len(cs) != 1 {
		t.Fatalf("Counters = %v, %v", cs, err)
	}
	// Rewriting the chains (here a repair) resets the counters, as in the kernel.
	f.Tamper("demo-fix", rules.IPv4)
	if err := Apply(ctx, f, goodRuleset("demo-fix", rules.IPv4)); err != nil {
		t.Fatal(err)
	}
	if cs, _ := f.Counters(ctx, "demo-fix", rules.IPv4); cs["pods"].Packets != 0 {
		t.Errorf("counters not reset by Apply: %v", cs)
	}
	f.SetCountersError(errors.New("boom"))
	if _, err := f.Counters(ctx, "demo-fix", rules.IPv4); err == nil {
		t.Error("injected counters error not returned")
	}
}

// recorder is a testing.TB that records failures instead of failing the real test.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func TestGolden(t *testing.T) {
	if Updating() {
		t.Skip("golden self-test does not run with -update")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "x.golden")
	if err := os.WriteFile(path, []byte("line one\nline two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &recorder{TB: t}
	Golden(r, path, "line one\nline two\n")
	if r.failed {
		t.Fatalf("equal content reported as mismatch: %s", r.msg)
	}
	r = &recorder{TB: t}
	Golden(r, path, "line one\nline 2\n")
	if !r.failed || !strings.Contains(r.msg, "line 2") || !strings.Contains(r.msg, "-update") {
		t.Fatalf("mismatch not detected or not explained: %v %q", r.failed, r.msg)
	}
	r = &recorder{TB: t}
	Golden(r, filepath.Join(dir, "missing.golden"), "x")
	if !r.failed || !strings.Contains(r.msg, "-update") {
		t.Fatalf("missing golden file not reported: %q", r.msg)
	}
	*update = true
	defer func() { *update = false }()
	r = &recorder{TB: t}
	Golden(r, filepath.Join(dir, "sub", "new.golden"), "fresh\n")
	if b, err := os.ReadFile(filepath.Join(dir, "sub", "new.golden")); r.failed || err != nil || string(b) != "fresh\n" {
		t.Fatalf("update did not write the file: %v %q %v", r.failed, b, err)
	}
}

func TestBuilders(t *testing.T) {
	snap := Snapshot(
		WithServices(
			Service("b", "web", ClusterIPs("10.96.0.10", "fd00:10:96::10"), LoadBalancer("203.0.113.10"), IngressProxyMode("203.0.113.11"),
				ExternalIPs("2001:db8::10"), ETPLocal(), Ports(Named("http", TCP(80)), UDP(53), SCTP(9))),
			Service("a", "z", Headless()),
			Service("a", "ext", ExternalName("example.com")),
		),
		WithNode(Node("node-a", PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))),
		WithProxyMode("ipvs"),
	)
	svcs := inputs.Services.Get(snap)
	var names []string
	for _, s := range svcs {
		names = append(names, s.Key())
	}
	if got := strings.Join(names, " "); got != "a/ext a/z b/web" {
		t.Errorf("services not sorted: %s", got)
	}
	web := svcs[2]
	if web.Type != fix.ServiceTypeLoadBalancer || len(web.ClusterIPs) != 2 || web.ClusterIPs[0] != netip.MustParseAddr("10.96.0.10") ||
		!web.LocalTrafficPolicy || len(web.Ports) != 3 || web.Ports[0].Name != "http" || web.Ports[1].Protocol != corev1.ProtocolUDP {
		t.Errorf("web built wrong: %+v", web)
	}
	if ing := web.Ingress; len(ing) != 2 || ing[0].Proxy || !ing[1].Proxy || ing[1].IP != netip.MustParseAddr("203.0.113.11") {
		t.Errorf("ingress built wrong: %+v", ing)
	}
	if !svcs[1].Headless || len(svcs[1].ClusterIPs) != 0 || svcs[0].Type != fix.ServiceTypeExternalName {
		t.Errorf("headless or ExternalName built wrong: %+v %+v", svcs[1], svcs[0])
	}
	if got := rules.IPv6.Prefixes(inputs.PodCIDRs.Get(snap)); len(got) != 1 || got[0].String() != "fd00:10:244:1::/64" {
		t.Errorf("pod CIDRs from node: %v", inputs.PodCIDRs.Get(snap))
	}
	if snap.Env.NodeName != "node-a" || snap.Env.ProxyMode != "ipvs" {
		t.Errorf("env: %+v", snap.Env)
	}
	if s := Snapshot(WithNode(Node("n", PodCIDRs("10.0.0.0/24"))), WithPodCIDRs()); len(inputs.PodCIDRs.Get(s)) != 0 {
		t.Errorf("WithPodCIDRs() should override the node: %v", inputs.PodCIDRs.Get(s))
	}
}

func TestReadREADME(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, "README.md")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "# demo-fix\n\n## What it does\n\nx\n\n## Configuration\n\n## Rules\n\n```\nchain X\n```\n\n## Metrics\n\n`nnm_demo_fix_total`\n\n## Example\n\n" +
		"```yaml\nfixes:\n  demo-fix:\n    enabled: true\n    hooks: [input]\n```\n"
	r := ReadREADME(t, write(good), "demo-fix")
	if r.Enabled == nil || !*r.Enabled || len(r.Options) != 1 || r.Options["hooks"] == nil {
		t.Fatalf("parsed %+v", r)
	}
	r.Contains(t, "a dump", "chain X")
	r.DocumentsMetrics(t, "nnm_demo_fix_total")

	for name, tc := range map[string]struct{ text, want string }{
		"missing section": {strings.Replace(good, "## Metrics", "## Figures", 1), `lacks section "## Metrics"`},
		"out of order":    {strings.NewReplacer("## Rules", "## Metrics", "## Metrics", "## Rules").Replace(good), "out of order"},
		"bad title":       {strings.Replace(good, "# demo-fix", "# Demo", 1), "title"},
		"no example":      {strings.Replace(good, "```yaml", "```text", 1), "no ```yaml example"},
		"other fix":       {strings.Replace(good, "  demo-fix:", "  other-fix:", 1), "does not configure fixes.demo-fix"},
		"not config":      {strings.Replace(good, "fixes:", "fixes:\n  - oops", 1), "not agent configuration"},
	} {
		rec := &recorder{TB: t}
		if r := ReadREADME(rec, write(tc.text), "demo-fix"); r != nil && name != "missing section" && name != "out of order" && name != "bad title" {
			t.Errorf("%s: a fatal problem must return nil", name)
		}
		if !rec.failed || !strings.Contains(rec.msg, tc.want) {
			t.Errorf("%s: failed=%v msg=%q, want %q", name, rec.failed, rec.msg, tc.want)
		}
	}
	rec := &recorder{TB: t}
	r.DocumentsMetrics(rec, "nnm_undocumented_total")
	r.Contains(rec, "x", "not there")
	if !rec.failed {
		t.Error("undocumented metric / missing text not reported")
	}
}

func TestCountsTakeStartsAgain(t *testing.T) {
	var c Counts
	if got := c.Take(); got == nil || len(got) != 0 {
		t.Fatalf("Take of fresh Counts = %v, want an empty map", got)
	}
	c.Add("save")
	c.Add("save")
	c.Add("restore")
	if c.Get("save") != 2 || c.Get("list") != 0 {
		t.Fatalf("Get(save), Get(list) = %d, %d; want 2, 0", c.Get("save"), c.Get("list"))
	}
	if got := c.Take(); len(got) != 2 || got["save"] != 2 || got["restore"] != 1 {
		t.Fatalf("Take = %v, want save:2 restore:1", got)
	}
	if got := c.Take(); len(got) != 0 {
		t.Fatalf("second Take = %v, want nothing", got)
	}
}
