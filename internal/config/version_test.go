package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// hooksOptions stands for a fix's options (invalid-drop's hooks) in ConfigureFix's tests.
type hooksOptions struct {
	Hooks []string `mapstructure:"hooks"`
}

// configureHooks is a fix's Configure over hooksOptions; got receives the options it was given last.
func configureHooks(got *map[string]any) func(map[string]any) error {
	return func(o map[string]any) error {
		*got = o
		return fix.Decode(o, &hooksOptions{})
	}
}

func loadFile(t *testing.T, body string, env []string, args ...string) (*Config, error) {
	t.Helper()
	return Load(flags(t, append(args, "--config", writeFile(t, body))...), env, ids)
}

// A typo in a file of this agent's version (declared, or no configVersion at all) fails as before,
// with "did you mean", at every level: a top-level key, a fix id, a fix's option.
func TestTypoAtCurrentVersionFails(t *testing.T) {
	for _, head := range []string{"", fmt.Sprintf("configVersion: %d\n", Version)} {
		lines := strings.Count(head, "\n")
		_, err := loadFile(t, head+"syncPeriodd: 5s\n", nil)
		if want := fmt.Sprintf("config: syncPeriodd (line %d): unknown key; did you mean syncPeriod?", lines+1); err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %s", head, err, want)
		}
		_, err = loadFile(t, head+"fixes:\n  invalid-drops: {enabled: true}\n", nil)
		if want := fmt.Sprintf("config: fixes.invalid-drops (line %d): unknown fix; did you mean invalid-drop?", lines+2); err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %s", head, err, want)
		}
		cfg, err := loadFile(t, head+"fixes:\n  invalid-drop:\n    hook: [input]\n", nil)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		warnings, err := cfg.ConfigureFix("invalid-drop", configureHooks(&got))
		if want := fmt.Sprintf("config: fixes.invalid-drop.hook (line %d): unknown key; did you mean hooks?", lines+3); err == nil || err.Error() != want || len(warnings) > 0 {
			t.Errorf("%q: got %v (warnings %q), want %s", head, err, warnings, want)
		}
	}
}

// A file of a newer configVersion loads: each key this agent does not know is named in a warning
// with both versions and ignored; the keys it knows are taken and still validated.
func TestNewerVersionKeysWarnAndLoad(t *testing.T) {
	newer := Version + 1
	file := fmt.Sprintf(`configVersion: %d
syncPeriod: 10s
shinyNewKey: on
newSection:
  depth: 3
fixes:
  brand-new-fix: {enabled: true}
  invalid-drop:
    enabled: true
    hooks: [input]
    newOption: 7
`, newer)
	cfg, err := loadFile(t, file, nil)
	if err != nil {
		t.Fatalf("a newer file must load: %v", err)
	}
	if cfg.SyncPeriod != 10*time.Second || cfg.FileVersion != newer {
		t.Errorf("syncPeriod %s, FileVersion %d; want 10s, %d", cfg.SyncPeriod, cfg.FileVersion, newer)
	}
	if on, _ := cfg.FixEnabled("invalid-drop"); !on {
		t.Error("fixes.invalid-drop.enabled from the newer file was lost")
	}
	if _, ok := cfg.Fixes["brand-new-fix"]; ok {
		t.Error("the unknown fix's section must not reach the configuration")
	}
	var got map[string]any
	optWarnings, err := cfg.ConfigureFix("invalid-drop", configureHooks(&got))
	if err != nil {
		t.Fatalf("an option of a newer version must be ignored: %v", err)
	}
	if _, ok := got["newOption"]; ok || got["hooks"] == nil {
		t.Errorf("the fix was configured with %v; want hooks and no newOption", got)
	}
	if _, ok := cfg.FixOptions("invalid-drop")["newOption"]; ok {
		t.Error("FixOptions must leave the ignored option out from then on (the engine restores the running options with it)")
	}
	all := strings.Join(append(cfg.Warnings, optWarnings...), "\n")
	for _, key := range []string{"shinyNewKey (line 3)", "newSection.depth (line 5)", "fixes.brand-new-fix (line 7)", "fixes.invalid-drop.newOption (line 11)"} {
		want := fmt.Sprintf("%s: unknown to this agent, which reads configVersion up to %d; the file declares configVersion %d, so it is taken for a key of a newer version and ignored", key, Version, newer)
		if strings.Count(all, want) != 1 {
			t.Errorf("want one warning %q; warnings:\n%s", want, all)
		}
	}
	if n := len(cfg.Warnings) + len(optWarnings); n != 4 {
		t.Errorf("%d warnings, want 4 (one per ignored key):\n%s", n, all)
	}

	// Known keys are still validated, typos of them included: a near miss of a known key in a newer file
	// is ignored as a possible new key, but the value of a key the agent knows is checked.
	for body, want := range map[string]string{
		"syncPeriod: soon\n": `config: syncPeriod (line 2): "soon" is not a duration such as 500ms, 30s or 1m30s`,
		"fixes:\n  invalid-drop:\n    hooks: {input: true}\n": `config: fixes.invalid-drop.hooks (line 4): a mapping is not a list such as [a, b] or "a,b"`,
	} {
		cfg, err := loadFile(t, fmt.Sprintf("configVersion: %d\n", newer)+body, nil)
		if err == nil {
			_, err = cfg.ConfigureFix("invalid-drop", configureHooks(&got))
		}
		if err == nil || err.Error() != want {
			t.Errorf("%q: got %v, want %s", body, err, want)
		}
	}
}

// The environment and flags are the agent's own manifest, written for this agent: an unknown key or
// option there is an error whatever version the file declares, and configVersion is the file's alone.
func TestNewerVersionEnvAndFlagsStayStrict(t *testing.T) {
	newerFile := fmt.Sprintf("configVersion: %d\nfixes:\n  invalid-drop: {}\n", Version+1)
	for _, c := range []struct {
		env, args []string
		want      string
	}{
		{args: []string{"--set", "syncPeriodd=5s"}, want: "config: syncPeriodd (--set): unknown key; did you mean syncPeriod?"},
		{args: []string{"--set", "fixes.invalid-drops.enabled=true"}, want: "config: fixes.invalid-drops: unknown fix; did you mean invalid-drop?"},
		{args: []string{"--enable-fix", "brand-new-fix"}, want: "config: fixes.brand-new-fix (--enable-fix): unknown fix"},
		{args: []string{"--set", "configVersion=9"}, want: "config: configVersion (--set): set only in the config file, where it says which configuration version the file is written for"},
		{env: []string{"NNM_FIXES_INVALID_DROP_HOOK=input"}, want: "config: fixes.invalid-drop.hook (NNM_FIXES_INVALID_DROP_HOOK): unknown key; did you mean hooks?"},
	} {
		cfg, err := loadFile(t, newerFile, c.env, c.args...)
		if err == nil {
			var got map[string]any
			_, err = cfg.ConfigureFix("invalid-drop", configureHooks(&got))
		}
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v %v: got %v, want %s", c.env, c.args, err, c.want)
		}
	}
}

// A configVersion that is no whole number from 1 is an error naming the value and what is accepted.
func TestMalformedConfigVersionFails(t *testing.T) {
	for body, shown := range map[string]string{
		"configVersion: two\n":   `"two"`,
		"configVersion: \"2\"\n": `"2"`,
		"configVersion: 1.5\n":   `1.5`,
		"configVersion: 0\n":     `0`,
		"configVersion: -3\n":    `-3`,
		"configVersion: [2]\n":   `a list`,
		"configVersion:\n":       `an empty value`,
	} {
		_, err := loadFile(t, "syncPeriod: 10s\n"+body, nil)
		want := fmt.Sprintf("(line 2): %s is not a configuration version; accepted: a whole number from 1 (this agent reads up to %d)", shown, Version)
		if err == nil || !strings.HasPrefix(err.Error(), "config: configVersion ") || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%q: got %v, want …%s", body, err, want)
		}
	}
}

// The README's row of configVersion (no variable, no flag, so TestREADMETable does not compare it)
// shows Version as its default.
func TestREADMEShowsConfigVersion(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("| `%s` | — | — (file only) | scalar | `%d` | reload |", VersionKey, Version)
	if !strings.Contains(string(b), want) {
		t.Errorf("README.md lacks the row starting %q", want)
	}
}
