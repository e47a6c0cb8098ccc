package nftables

import (
	"context"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// oddComment holds everything nft cannot take between double quotes as it is: a quote, a
// backslash, a newline, a tab, DEL, non-ASCII; plus the printable ASCII punctuation it can.
const oddComment = "ns\"x/we\\ird\nname\t\x7f\u00e9:!#$%&'()*+,-.;<=>?@[]^_`{|}~"

// oddCommentText is what nft gets and the kernel keeps: one byte for each byte of oddComment.
const oddCommentText = "ns'x/we/ird?name????:!#$%&'()*+,-.;<=>?@[]^_`{|}~"

func TestCommentText(t *testing.T) {
	if got := commentText(oddComment); got != oddCommentText {
		t.Errorf("commentText(%q) = %q, want %q", oddComment, got, oddCommentText)
	}
	if got := commentText("default/web:http"); got != "default/web:http" {
		t.Errorf("an ordinary comment changed: %q", got)
	}
}

// oddRuleset is the External-IP ruleset whose second map entry (an object from a `plan` file, say)
// and one rule carry oddComment.
func oddRuleset(f rules.Family) *rules.Ruleset {
	entries := threeEntries(f)
	entries[1].Comment = oddComment
	rs := externalIPRuleset(f, entries)
	rs.Chains[1].Rules[0].Comment = `say "hi"`
	return rs
}

// One object with an odd comment is rendered with its comment made safe; the whole fix is not
// refused because of it (it was: "map entry comment ... must not contain quotes").
func TestOddCommentsPerObject(t *testing.T) {
	ctx := context.Background()
	for _, f := range rules.Families {
		b := newFakeKernel().backend(t)
		rs := oddRuleset(f)
		text, err := b.Render(rs)
		if err != nil {
			t.Fatalf("%s: Render refused the whole fix for one comment: %v", f, err)
		}
		for _, want := range []string{`comment "` + oddCommentText + `"`, `comment "say 'hi'"`} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: rendered text lacks %s:\n%s", f, want, text)
			}
		}
		if strings.Count(text, "\n") != strings.Count(mustRender(t, b, externalIPRuleset(f, threeEntries(f))), "\n") {
			t.Errorf("%s: a newline in a comment split a line:\n%s", f, text)
		}
		if err := apply(ctx, b, rs); err != nil {
			t.Fatalf("%s: Apply: %v", f, err)
		}
		if ok, err := inSync(ctx, b, rs); err != nil || !ok {
			t.Errorf("%s: InSync after Apply = %v, %v", f, ok, err)
		}
	}
}

func mustRender(t *testing.T, b *Backend, rs *rules.Ruleset) string {
	t.Helper()
	text, err := b.Render(rs)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// The real nft parses the made-safe comments, the kernel keeps them as rendered, and a re-apply
// finds the table in sync and sends nothing (a comment the kernel stored differently would be
// "repaired" on every sync).
func TestKernelOddComments(t *testing.T) {
	netns.Require(t, "nft")
	ctx := context.Background()
	for _, f := range rules.Families {
		ns := netns.New(t, "nnm-nft")
		k := newRealKernel()
		b := k.backend(t)
		rs := oddRuleset(f)
		inNS(t, ns, func() error { return apply(ctx, b, rs) })
		listing := nftList(t, ns, "list", "table", string(nftFamily(f)), TableName(rs.Fix))
		for _, want := range []string{`comment "` + oddCommentText + `"`, `comment "say 'hi'"`} {
			if !strings.Contains(listing, want) {
				t.Errorf("%s: kernel listing lacks %s:\n%s", f, want, listing)
			}
		}
		rec := k.rec(nftFamily(f), TableName(rs.Fix))
		n, lists := rec.count(), rec.listCount()
		// Someone else commits, so the check below must read our table back and compare.
		ns.MustExec("nft", "add table "+string(nftFamily(f))+" someone-else")
		inNS(t, ns, func() error {
			if ok, err := inSync(ctx, b, rs); err != nil || !ok {
				t.Errorf("%s: InSync after Apply = %v, %v", f, ok, err)
			}
			return apply(ctx, b, oddRuleset(f))
		})
		if sent := rec.sentSince(n); len(sent) != 0 {
			t.Errorf("%s: re-apply sent %q", f, sent)
		}
		if rec.listCount() == lists {
			t.Errorf("%s: the check after a foreign commit did not read the table back", f)
		}
	}
}

// FuzzCommentText: any comment (up to the 128-byte limit) renders, as printable ASCII without quotes
// or backslashes and of the same length, into exactly the element it belongs to.
func FuzzCommentText(f *testing.F) {
	for _, s := range []string{oddComment, "default/web:http", "", "\"", "\\\"", "\n\r\t", "\xff\xfe", "comment \"x\" ; flush ruleset"} {
		f.Add(s)
	}
	b := newFakeKernel().backend(f)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > rules.MaxComment {
			s = s[:rules.MaxComment]
		}
		got := commentText(s)
		if len(got) != len(s) {
			t.Fatalf("commentText(%q) = %q: length changed", s, got)
		}
		for i := 0; i < len(got); i++ {
			if c := got[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
				t.Fatalf("commentText(%q) = %q: byte %q left", s, got, c)
			}
		}
		entries := threeEntries(rules.IPv4)
		entries[1].Comment = s
		text, err := b.Render(externalIPRuleset(rules.IPv4, entries))
		if err != nil {
			t.Fatalf("Render with comment %q: %v", s, err)
		}
		if s != "" && !strings.Contains(text, `comment "`+got+`" : `) {
			t.Fatalf("rendered text lacks the element comment %q:\n%s", got, text)
		}
	})
}
