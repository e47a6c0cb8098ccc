package config

import (
	"reflect"
	"strings"
	"testing"
)

const overridesFile = `configVersion: 1
fixes:
  invalid-drop:
    enabled: false
    hooks: [input]
nodeOverrides:
- nodeSelector:
    matchLabels: {pool: canary}
  fixes:
    invalid-drop: {enabled: true}
- nodeSelector:
    matchExpressions:
    - {key: zone, operator: In, values: [a, b]}
    - {key: legacy, operator: DoesNotExist}
  fixes:
    invalid-drop:
      enabled: true
      hooks: [input, forward]
- nodeSelector:
    matchLabels: {pool: canary, zone: a}
  fixes:
    invalid-drop: {enabled: false}
`

// Resolution: the first entry whose selector matches wins (the third entry also selects
// pool=canary,zone=a but comes later); matchExpressions (In, DoesNotExist) select; no match, or an
// unknown Node (nil labels), leaves the base configuration; an entry's options replace the base's
// option by option, the others stay.
func TestNodeOverridesResolve(t *testing.T) {
	cfg, err := loadFile(t, overridesFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.NodeOverrides()); n != 3 {
		t.Fatalf("%d overrides, want 3", n)
	}
	for _, tc := range []struct {
		name    string
		labels  map[string]string
		index   int
		enabled bool
		hooks   any
	}{
		{"first match wins", map[string]string{"pool": "canary", "zone": "a"}, 0, true, []any{"input"}},
		{"matchExpressions", map[string]string{"zone": "b"}, 1, true, []any{"input", "forward"}},
		{"DoesNotExist excludes", map[string]string{"zone": "b", "legacy": "yes"}, -1, false, []any{"input"}},
		{"no match is the base", map[string]string{"pool": "general"}, -1, false, []any{"input"}},
		{"unknown node is the base", nil, -1, false, []any{"input"}},
		{"label keys compare exactly", map[string]string{"Pool": "canary"}, -1, false, []any{"input"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eff, ov := cfg.ForNode(tc.labels)
			if ov.Index != tc.index || eff.Override() != ov || cfg.ResolveOverride(tc.labels) != ov {
				t.Errorf("override %v (config says %v), want index %d", ov, eff.Override(), tc.index)
			}
			if on, set := eff.FixEnabled("invalid-drop"); on != tc.enabled || !set {
				t.Errorf("enabled %v (set %v), want %v", on, set, tc.enabled)
			}
			if got := eff.FixOptions("invalid-drop")["hooks"]; !reflect.DeepEqual(got, tc.hooks) {
				t.Errorf("hooks %#v, want %#v", got, tc.hooks)
			}
			if eff.Base() != cfg {
				t.Error("Base is not the loaded configuration")
			}
			// Resolving again from an effective configuration starts from the base.
			again, ov2 := eff.ForNode(map[string]string{"pool": "general"})
			if ov2.Applies() || again.Base() != cfg {
				t.Errorf("ForNode of an effective configuration: %v", ov2)
			}
		})
	}
	if on, _ := cfg.FixEnabled("invalid-drop"); on {
		t.Error("ForNode changed the base configuration")
	}
	if got := cfg.NodeOverrides()[1].Selector(); !strings.Contains(got, "zone in (a,b)") || !strings.Contains(got, "!legacy") {
		t.Errorf("selector text %q", got)
	}
	_, ov := cfg.ForNode(map[string]string{"pool": "canary"})
	if ov.String() != "override 0 (pool=canary)" {
		t.Errorf("String: %q", ov)
	}
}

// An option an entry set that the fix refuses is named as the entry's, with its line.
func TestNodeOverrideOptionErrorNamesTheEntry(t *testing.T) {
	cfg, err := loadFile(t, "nodeOverrides:\n- nodeSelector: {}\n  fixes:\n    invalid-drop:\n      hook: [input]\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	eff, ov := cfg.ForNode(map[string]string{})
	if ov.Index != 0 || ov.Selector != "(every node)" {
		t.Fatalf("an empty selector selects every node: %v", ov)
	}
	var got map[string]any
	_, err = eff.ConfigureFix("invalid-drop", configureHooks(&got))
	want := "config: nodeOverrides[0].fixes.invalid-drop.hook (line 5): unknown key; did you mean hooks?"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

// A bad entry is an error naming the entry's index and field, and where it is in the file.
func TestNodeOverridesInvalid(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"nodeOverrides:\n- nodeSelector:\n    matchExpressions:\n    - {key: pool, operator: Within, values: [a]}\n",
			`config: nodeOverrides[0].nodeSelector (line 2): "Within" is not a valid label selector operator`},
		{"nodeOverrides:\n- nodeSelector:\n    matchLabels: {pool: canary}\n- nodeSelector:\n    matchLabels: {\"bad key!\": x}\n",
			"config: nodeOverrides[1].nodeSelector (line 4): "},
		{"nodeOverrides:\n- nodeSelector:\n    matchLabel: {pool: canary}\n",
			"config: nodeOverrides[0].nodeSelector.matchLabel (line 3): unknown key; did you mean matchLabels?"},
		{"nodeOverrides:\n- fixes: {invalid-drop: {enabled: true}}\n",
			"config: nodeOverrides[0] (line 2): no nodeSelector; accepted: a label selector"},
		{"nodeOverrides:\n- nodeSelector: {}\n  fixes:\n    invalid-drops: {enabled: true}\n",
			"config: nodeOverrides[0].fixes.invalid-drops (line 4): unknown fix; did you mean invalid-drop?"},
		{"nodeOverrides:\n- nodeSelector: {}\n  fixes:\n    invalid-drop: {enabled: maybe}\n",
			`config: nodeOverrides[0].fixes.invalid-drop.enabled (line 4): "maybe" is not true or false`},
		{"nodeOverrides:\n- nodeSelector: {}\n  fix: {}\n",
			"config: nodeOverrides[0].fix (line 3): unknown key; did you mean fixes?"},
		{"nodeOverrides: {pool: canary}\n",
			"config: nodeOverrides (line 1): a mapping is not a list of"},
		{"nodeOverrides:\n- pool=canary\n",
			`config: nodeOverrides[0] (line 2): "pool=canary" is not a mapping`},
		{"nodeOverrides:\n- nodeSelector:\n    matchExpressions:\n    - {key: pool, op: In}\n",
			"config: nodeOverrides[0].nodeSelector.matchExpressions[0].op (line 4): unknown key; accepted: key, operator, values"},
	} {
		_, err := loadFile(t, tc.file, nil)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q:\n got  %v\n want %s…", tc.file, err, tc.want)
		}
	}
	// Not from the environment or flags: a list of selectors is no single value.
	_, err := Load(flags(t, "--set", "nodeOverrides=x"), nil, ids)
	if err == nil || !strings.Contains(err.Error(), "nodeOverrides (--set): set only in the config file") {
		t.Errorf("--set nodeOverrides: %v", err)
	}
}

// readFile and parseNodeOverrides build each key path's origins key beside the path as written, a
// segment at a time: it is originKey of the path, whatever the spelling (fix options in any case and
// with '-' or '_', inside nodeOverrides too, and a label named fixes).
func TestOriginKeysAreOriginKeyOfTheWrittenPath(t *testing.T) {
	file := "SyncPeriod: 5s\nfixes:\n  invalid-drop:\n    Exempt_Source-CIDRs: []\n    hooks: [input]\n" +
		"nodeOverrides:\n- nodeSelector:\n    matchLabels: {fixes: x, Pool: a}\n  fixes:\n    invalid-drop: {Hooks: [input, forward], enabled: true}\n"
	o := newOrigins()
	_, overrides, err := readFile(writeFile(t, file), &o)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseNodeOverrides(overrides, []string{"invalid-drop"}, o, Version); err != nil {
		t.Fatal(err)
	}
	if len(o.m) < 8 {
		t.Fatalf("only %d key paths recorded", len(o.m))
	}
	for k, x := range o.m {
		if want := originKey(x.written); k != want {
			t.Errorf("%s recorded as %q, originKey gives %q", x.written, k, want)
		}
	}
}
