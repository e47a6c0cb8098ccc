package main

import (
	"strings"
	"testing"
)

func rs(texts ...string) ruleset {
	r := ruleset{}
	for _, t := range texts {
		set, _, _ := strings.Cut(t, " ")
		r[line{set: set, key: t, text: t}]++
	}
	return r
}

// An upgrade rewrites a fix's rules in another table and form: the fixes mode counts a sample as
// lacking only when a fix of the baseline has no jump to a chain with rules, or no rule in its
// nnm- table, in a rule set.
func TestMissingFixes(t *testing.T) {
	t.Setenv("NNM_SAMPLER_MODE", "fixes")
	oldForm := []string{
		`ip filter INPUT: rule xt → NNM-INVALID-INPUT comment "network-node-manager:invalid-drop"`,
		`ip filter NNM-INVALID-INPUT: rule xt,immediate comment "invalid-drop/dropped-input: drop"`,
		`ip6 filter INPUT: rule xt → NNM-INVALID-INPUT comment "network-node-manager:invalid-drop"`,
		`ip6 filter NNM-INVALID-INPUT: rule xt,immediate comment "invalid-drop/dropped-input: drop"`,
		`ip nnm-mss-clamp forward: rule meta,cmp`,
	}
	newForm := []string{
		`ip mangle INPUT: rule xt → NNM-INVALID-INPUT comment "network-node-manager:invalid-drop"`,
		`ip mangle NNM-INVALID-INPUT: rule ct,cmp,immediate comment "invalid-drop/dropped-input: drop"`,
		`ip6 mangle INPUT: rule xt → NNM-INVALID-INPUT comment "network-node-manager:invalid-drop"`,
		`ip6 mangle NNM-INVALID-INPUT: rule ct,cmp,immediate comment "invalid-drop/dropped-input: drop"`,
		`ip nnm-mss-clamp postrouting: rule meta,cmp,exthdr`,
	}
	base := rs(oldForm...)
	if got := lacks(base, base); len(got) != 0 {
		t.Errorf("the baseline lacks %v", got)
	}
	for name, cur := range map[string]ruleset{
		"the new release's form": rs(newForm...),
		"both forms":             rs(append(append([]string{}, oldForm...), newForm...)...),
		"IPv4 new, IPv6 old":     rs(append(append([]string{}, newForm[:2]...), append(oldForm[2:4], newForm[4])...)...),
	} {
		if got := lacks(base, cur); len(got) != 0 {
			t.Errorf("%s: lacking %v", name, got)
		}
	}
	for name, c := range map[string]struct {
		cur  ruleset
		want string
	}{
		"the IPv6 jump gone":     {rs(append(append([]string{}, oldForm[:2]...), oldForm[3:]...)...), "ip6: the rules of invalid-drop"},
		"an empty IPv4 chain":    {rs(append([]string{oldForm[0]}, oldForm[2:]...)...), "ip: the rules of invalid-drop"},
		"the nnm- table emptied": {rs(oldForm[:4]...), "ip: the rules of mss-clamp"},
		"a jump without comment": {rs(`ip filter INPUT: rule xt → NNM-INVALID-INPUT`, oldForm[1], oldForm[2], oldForm[3], oldForm[4]), "ip: the rules of invalid-drop"},
	} {
		got := lacks(base, c.cur)
		if len(got) != 1 || got[0].text != c.want {
			t.Errorf("%s: lacking %v, want [%s]", name, got, c.want)
		}
	}
	// Without the mode, every line counts.
	t.Setenv("NNM_SAMPLER_MODE", "")
	if got := lacks(base, rs(newForm...)); len(got) != len(oldForm) {
		t.Errorf("line mode: lacking %d lines, want %d", len(got), len(oldForm))
	}
}
