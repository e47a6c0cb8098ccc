package config

import (
	"errors"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// Configuration errors are typed: a KeyError names the key as written, where it was set, the
// problem and, for an unknown key, the suggestion; a fix's option error travels inside it as a
// *fix.OptionError (no text re-parsed). The text stays the one shape the README shows.
func TestKeyErrorsAreTyped(t *testing.T) {
	// A top-level typo.
	_, err := loadFile(t, "syncPeriodd: 5s\n", nil)
	var ke *KeyError
	if !errors.As(err, &ke) || ke.Path != "syncPeriodd" || ke.Where != "line 1" || ke.Suggestion != "syncPeriod" {
		t.Errorf("top-level typo: %#v", ke)
	}
	// A fix's option the fix does not know, from the environment.
	cfg, err := Load(nil, []string{"NNM_FIXES_INVALID_DROP_HOOK=input"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	_, err = cfg.ConfigureFix("invalid-drop", configureHooks(&got))
	var oe *fix.OptionError
	ke = nil
	if !errors.As(err, &ke) || !errors.As(err, &oe) {
		t.Fatalf("unknown option: %v is not a KeyError wrapping a fix.OptionError", err)
	}
	if ke.Path != "fixes.invalid-drop.hook" || ke.Key != "hook" || ke.Where != "NNM_FIXES_INVALID_DROP_HOOK" || ke.Suggestion != "hooks" || !oe.Unknown {
		t.Errorf("unknown option: %#v / %#v", ke, oe)
	}
	if want := "config: fixes.invalid-drop.hook (NNM_FIXES_INVALID_DROP_HOOK): unknown key; did you mean hooks?"; err.Error() != want {
		t.Errorf("text %q, want %q", err, want)
	}
	// A value the fix's Parse refuses (fix.Invalid, through fix.Settings), and a problem of the
	// section as a whole (Key "").
	s, err := fix.NewSettings("invalid-drop", func() hooksOptions { return hooksOptions{Hooks: []string{"input"}} },
		func(c hooksOptions) (hooksOptions, error) {
			if len(c.Hooks) > 1 {
				return c, errors.Join(fix.Invalid("hooks", "%d hooks; accepted: one", len(c.Hooks)), fix.Invalid("", "nothing to do"))
			}
			return c, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err = loadFile(t, "fixes:\n  invalid-drop:\n    hooks: [input, forward]\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cfg.ConfigureFix("invalid-drop", s.Configure)
	want := "config: fixes.invalid-drop.hooks (line 3): 2 hooks; accepted: one\nconfig: fixes.invalid-drop (line 2): nothing to do"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	oe = nil
	if !errors.As(err, &oe) || oe.Fix != "invalid-drop" {
		t.Errorf("Settings must name the fix on its Parse's errors: %#v", oe)
	}
}

// One key normaliser: a fix option spelt differently in the file, the environment and --set is one
// key (the higher layer wins, the fix sees it once); two spellings in one file are "set twice".
func TestFixOptionSpellingsAreOneKey(t *testing.T) {
	file := "fixes:\n  invalid-drop:\n    exempt-source-cidrs: [10.0.0.0/8]\n"
	cfg, err := loadFile(t, file, []string{"NNM_FIXES_INVALID_DROP_EXEMPT_SOURCE_CIDRS=192.168.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	opts := cfg.FixOptions("invalid-drop")
	if len(opts) != 1 || opts[NormalizeKey("exemptSourceCIDRs")] != "192.168.0.0/16" {
		t.Errorf("options %v: want the environment's value under one key", opts)
	}
	cfg, err = loadFile(t, file, nil, "--set", "fixes.invalid-drop.exemptSourceCIDRs=172.16.0.0/12")
	if err != nil {
		t.Fatal(err)
	}
	if opts := cfg.FixOptions("invalid-drop"); len(opts) != 1 || opts["exemptsourcecidrs"] != "172.16.0.0/12" {
		t.Errorf("options %v: want --set's value under one key", opts)
	}
	_, err = loadFile(t, "fixes:\n  invalid-drop:\n    exemptSourceCIDRs: []\n    exempt_source_cidrs: []\n", nil)
	if want := "config: fixes.invalid-drop.exempt_source_cidrs is set twice (lines 3 and 4)"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}
