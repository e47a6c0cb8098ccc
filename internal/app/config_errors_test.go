package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/internal/config"
)

// TestConfigErrorsOneShape (#23): every bad input of the issue, from the file, the environment and
// flags, through the real command, gives one error of one shape: the key as written, where it was set
// (file line, variable, flag), the value and what is accepted; never a Go type name, never twice.
// The whole message is compared.
func TestConfigErrorsOneShape(t *testing.T) {
	base := []string{"NNM_PROXY_MODE=ipvs", "NNM_IPTABLES_VARIANT=nft"}
	cases := []struct {
		name, file string
		env        []string
		args       []string
		want       string
	}{
		// syncPeriod: 5x
		{name: "bad duration, file", file: "syncPeriod: 5x\n",
			want: `config: syncPeriod (line 1): "5x" is not a duration such as 500ms, 30s or 1m30s`},
		{name: "bad duration, environment", env: []string{"NNM_SYNC_PERIOD=5x"},
			want: `config: syncPeriod (NNM_SYNC_PERIOD): "5x" is not a duration such as 500ms, 30s or 1m30s`},
		{name: "bad duration, flag", args: []string{"--sync-period", "5x"},
			want: `config: syncPeriod (--sync-period): "5x" is not a duration such as 500ms, 30s or 1m30s`},
		{name: "bad duration, --set", args: []string{"--set", "syncPeriod=5x"},
			want: `config: syncPeriod (--set): "5x" is not a duration such as 500ms, 30s or 1m30s`},
		{name: "number without a unit", file: "\nminSyncPeriod: 30\n",
			want: `config: minSyncPeriod (line 2): 30 is not a duration such as 500ms, 30s or 1m30s`},
		// an unknown option under a fix
		{name: "unknown fix option, file", file: "fixes:\n  invalid-drop:\n    hook: input\n",
			want: `config: fixes.invalid-drop.hook (line 3): unknown key; did you mean hooks?`},
		{name: "unknown fix option, environment", env: []string{"NNM_FIXES_INVALID_DROP_HOOK=input"},
			want: `config: fixes.invalid-drop.hook (NNM_FIXES_INVALID_DROP_HOOK): unknown key; did you mean hooks?`},
		{name: "unknown fix option, --set", args: []string{"--set", "fixes.invalid-drop.hook=input"},
			want: `config: fixes.invalid-drop.hook (--set): unknown key; did you mean hooks?`},
		{name: "unrelated fix option lists what is accepted", file: "fixes:\n  invalid-drop:\n    colour: red\n",
			want: `config: fixes.invalid-drop.colour (line 3): unknown key; accepted: enabled, exemptSourceCIDRs, hooks, protocols`},
		{name: "fix option of the wrong kind", file: "fixes:\n  invalid-drop:\n    hooks: {input: true}\n",
			want: `config: fixes.invalid-drop.hooks (line 3): a mapping is not a list such as [a, b] or "a,b"`},
		{name: "fix option the fix refuses", env: []string{"NNM_FIXES_INVALID_DROP_HOOKS=output"},
			want: `config: fixes.invalid-drop.hooks (NNM_FIXES_INVALID_DROP_HOOKS): "output" is not a valid hook (want input or forward)`},
		// fixes: {invalid-drop: true}
		{name: "fix section not a mapping, file", file: "fixes: {invalid-drop: true}\n",
			want: `config: fixes.invalid-drop (line 1): true is not a mapping such as {enabled: true}`},
		{name: "fix section not a mapping, --set", args: []string{"--set", "fixes.invalid-drop=true"},
			want: `config: fixes.invalid-drop (--set): "true" is not a mapping such as {enabled: true}`},
		{name: "fixes not a mapping", file: "fixes: [invalid-drop]\n",
			want: `config: fixes (line 1): a list is not a mapping of fix ids such as {invalid-drop: {enabled: true}}`},
		{name: "bad enabled", file: "fixes:\n  invalid-drop:\n    enabled: perhaps\n",
			want: `config: fixes.invalid-drop.enabled (line 3): "perhaps" is not true or false`},
		{name: "bad enabled, environment", env: []string{"NNM_FIXES_INVALID_DROP_ENABLED=perhaps"},
			want: `config: fixes.invalid-drop.enabled (NNM_FIXES_INVALID_DROP_ENABLED): "perhaps" is not true or false`},
		// a key given twice
		{name: "key twice", file: "backend: nftables\nsyncPeriod: 10s\nfamilies: [ipv4]\nsyncPeriod: 20s\n",
			want: `config: syncPeriod is set twice (lines 2 and 4)`},
		{name: "key twice, other case", file: "syncPeriod: 10s\nsyncperiod: 20s\n",
			want: `config: syncperiod is set twice (lines 1 and 2)`},
		{name: "fix option twice", file: "fixes:\n  invalid-drop:\n    hooks: [input]\n    hooks: [forward]\n",
			want: `config: fixes.invalid-drop.hooks is set twice (lines 3 and 4)`},
		// an unknown top-level key
		{name: "unknown key, file", file: "backend: nftables\nsyncPeriodd: 5s\n",
			want: `config: syncPeriodd (line 2): unknown key; did you mean syncPeriod?`},
		{name: "unknown key, --set", args: []string{"--set", "syncPeriodd=5s"},
			want: `config: syncPeriodd (--set): unknown key; did you mean syncPeriod?`},
		{name: "unknown fix", file: "fixes:\n  invalid-drops: {enabled: true}\n",
			want: `config: fixes.invalid-drops (line 2): unknown fix; did you mean invalid-drop?`},
		// values outside what is accepted
		{name: "bad backend, flag", args: []string{"--backend", "ebpf"},
			want: `config: backend (--backend): "ebpf" is not one of auto, iptables, nftables`},
		{name: "bad backend, environment", env: []string{"NNM_BACKEND=ebpf"},
			want: `config: backend (NNM_BACKEND): "ebpf" is not one of auto, iptables, nftables`},
		{name: "list for a single value", file: "backend: [nftables]\n",
			want: `config: backend (line 1): a list is not a single value`},
		{name: "bad bool, flag", args: []string{"--metrics-secure=maybe"},
			want: `config: metricsSecure (--metrics-secure): "maybe" is not true or false`},
		{name: "minSyncPeriod above syncPeriod", file: "syncPeriod: 500ms\n",
			want: `config: minSyncPeriod: 1s is longer than syncPeriod 500ms (line 1); accepted: at most syncPeriod (changes would wait longer than a full resync)`},
		// --kubeconfig /does/not/exist
		{name: "kubeconfig missing, flag", args: []string{"--kubeconfig", "/does/not/exist"},
			want: `config: kubeconfig (--kubeconfig): "/does/not/exist": no such file; accepted: a kubeconfig file, or no value for the files in KUBECONFIG, else the in-cluster config`},
		{name: "kubeconfig missing, environment", env: []string{"NNM_KUBECONFIG=/does/not/exist"},
			want: `config: kubeconfig (NNM_KUBECONFIG): "/does/not/exist": no such file; accepted: a kubeconfig file, or no value for the files in KUBECONFIG, else the in-cluster config`},
	}
	defer func(e func() []string) { config.Environ = e }(config.Environ)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := append(append([]string{}, base...), c.env...)
			config.Environ = func() []string { return env }
			args := append([]string{"plan", "--services", examples + "services.yaml"}, c.args...)
			if c.file != "" {
				p := filepath.Join(t.TempDir(), "config.yaml")
				if err := os.WriteFile(p, []byte(c.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", p)
			}
			_, err := runCmd(t, args...)
			if err == nil {
				t.Fatalf("want %q, got no error", c.want)
			}
			if err.Error() != c.want {
				t.Errorf("got  %s\nwant %s", err, c.want)
			}
		})
	}
}

// The README's configuration section shows errors as they appear; they must stay true.
func TestREADMEShowsConfigErrors(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`config: syncPeriod (line 1): "5x" is not a duration such as 500ms, 30s or 1m30s`,
		`config: fixes.invalid-drop.hook (NNM_FIXES_INVALID_DROP_HOOK): unknown key; did you mean hooks?`,
		`config: syncPeriod is set twice (lines 2 and 4)`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md does not show %q", want)
		}
	}
}

// cleanup refuses flags it does not read (#23): it removes what both backends own in both families,
// so --backend or --families would only mislead. Refused while parsing: nothing is cleaned.
func TestCleanupRefusesFlagsItDoesNotRead(t *testing.T) {
	const reads = "cleanup reads only --config, --set, --dry-run and --node-name, --kubeconfig, --iptables-variant, --proc-sys-path, --log-level, --log-format (it removes what both backends own, in both families)"
	for _, args := range [][]string{
		{"--backend", "x"},
		{"--families", "ipv4"},
		{"--pod-cidrs", "10.0.0.0/8"},
		{"--enable-fix", "invalid-drop"},
		{"--bogus-flag"},
	} {
		name := args[0]
		// A config file that does not exist: should a flag ever be accepted again, cleanup stops
		// at loading the configuration instead of cleaning the host.
		_, err := runCmd(t, append([]string{"cleanup", "--config", "/nonexistent/nnm-test.yaml"}, args...)...)
		want := "cleanup: unknown flag: " + name + "; " + reads
		if err == nil || err.Error() != want {
			t.Errorf("cleanup %v:\ngot  %v\nwant %s", args, err, want)
		}
	}
}
