package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

var ids = []string{"invalid-drop", "ipvs-externalip-dnat"}

// legacy are the in-tree fixes' legacy variables (their Spec.LegacyEnabledEnv).
var legacy = []fix.Legacy{{Fix: "invalid-drop", Env: "RULE_DROP_INVALID_INPUT_ENABLE"}, {Fix: "ipvs-externalip-dnat", Env: "RULE_EXTERNAL_CLUSTER_ENABLE"}}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestDefaults(t *testing.T) {
	cfg, err := Load(nil, nil, ids)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinSyncPeriod != time.Second || cfg.SyncPeriod != 30*time.Second || cfg.Backend != "auto" {
		t.Fatalf("unexpected defaults: %+v", cfg)
	}
	if _, set := cfg.FixEnabled("invalid-drop"); set {
		t.Fatal("no fix should be explicitly enabled by default")
	}
}

func TestPrecedenceFileEnvFlags(t *testing.T) {
	file := writeFile(t, `
backend: nftables
syncPeriod: 10s
minSyncPeriod: 2s
podCIDRs: [10.244.1.0/24]
fixes:
  invalid-drop:
    enabled: false
    hooks: [input, forward]
`)
	env := []string{"NNM_SYNC_PERIOD=20s", "NNM_FIXES_INVALID_DROP_ENABLED=true", "NNM_FIXES_INVALID_DROP_PROTOCOLS=tcp"}
	cfg, err := Load(flags(t, "--config", file, "--sync-period", "40s"), env, ids)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Backend != "nftables" {
		t.Errorf("backend from file: got %q", cfg.Backend)
	}
	if cfg.MinSyncPeriod != 2*time.Second {
		t.Errorf("minSyncPeriod from file: got %s", cfg.MinSyncPeriod)
	}
	if cfg.SyncPeriod != 40*time.Second {
		t.Errorf("flag must beat env and file: got %s", cfg.SyncPeriod)
	}
	if on, set := cfg.FixEnabled("invalid-drop"); !on || !set {
		t.Errorf("env must beat file for fixes.invalid-drop.enabled")
	}
	opts := cfg.FixOptions("invalid-drop")
	if _, ok := opts["enabled"]; ok {
		t.Error("FixOptions must not contain enabled")
	}
	if opts["protocols"] != "tcp" {
		t.Errorf("fix option from env: got %#v", opts)
	}
	if len(opts["hooks"].([]any)) != 2 {
		t.Errorf("fix option from file: got %#v", opts["hooks"])
	}
}

func TestEnvOnly(t *testing.T) {
	cfg, err := Load(nil, []string{"NNM_BACKEND=iptables", "NNM_POD_CIDRS=10.0.0.0/24, fd00::/64", "NNM_FAMILIES=ipv6"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Backend != "iptables" || len(cfg.PodCIDRs) != 2 || len(cfg.ParsedFamilies()) != 1 {
		t.Fatalf("env not applied: %+v", cfg)
	}
}

func TestLegacyEnvironment(t *testing.T) {
	env := []string{"POD_CIDR_IPV4=10.244.3.0/24", "POD_CIDR_IPV6=fd00:10:244:3::/64",
		"RULE_DROP_INVALID_INPUT_ENABLE=false", "RULE_EXTERNAL_CLUSTER_ENABLE=true"}
	cfg, err := Load(nil, env, ids, legacy...)
	if err != nil {
		t.Fatal(err)
	}
	cidrs, _ := cfg.ParsedPodCIDRs()
	if len(cidrs) != 2 || cidrs[0].String() != "10.244.3.0/24" {
		t.Errorf("legacy pod CIDRs: %v", cidrs)
	}
	if on, set := cfg.FixEnabled("invalid-drop"); on || !set {
		t.Error("RULE_DROP_INVALID_INPUT_ENABLE=false must disable invalid-drop")
	}
	if on, set := cfg.FixEnabled("ipvs-externalip-dnat"); !on || !set {
		t.Error("RULE_EXTERNAL_CLUSTER_ENABLE=true must enable ipvs-externalip-dnat")
	}
	// The new variable wins over the legacy one.
	cfg, err = Load(nil, append(env, "NNM_FIXES_INVALID_DROP_ENABLED=true"), ids, legacy...)
	if err != nil {
		t.Fatal(err)
	}
	if on, _ := cfg.FixEnabled("invalid-drop"); !on {
		t.Error("NNM_FIXES_INVALID_DROP_ENABLED must beat RULE_DROP_INVALID_INPUT_ENABLE")
	}
	if _, err := Load(nil, []string{"RULE_DROP_INVALID_INPUT_ENABLE=maybe"}, ids, legacy...); err == nil || !strings.Contains(err.Error(), "RULE_DROP_INVALID_INPUT_ENABLE") {
		t.Errorf("bad legacy value must name the variable, got %v", err)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	cases := []struct {
		name, file string
		env        []string
		args       []string
		want       string
	}{
		{name: "unknown top-level key", file: "bakend: iptables\n", want: "bakend"},
		{name: "unknown fix", file: "fixes:\n  no-such-fix:\n    enabled: true\n", want: "no-such-fix"},
		{name: "bad duration in file", file: "syncPeriod: soon\n", want: "syncPeriod"},
		{name: "bad duration in env", env: []string{"NNM_MIN_SYNC_PERIOD=fast"}, want: "minSyncPeriod"},
		{name: "bad backend", args: []string{"--backend", "ebpf"}, want: "backend"},
		{name: "bad family", env: []string{"NNM_FAMILIES=ipv5"}, want: "families"},
		{name: "bad pod CIDR", file: "podCIDRs: [10.0.0.300/24]\n", want: "podCIDRs"},
		{name: "bad enabled", file: "fixes:\n  invalid-drop:\n    enabled: perhaps\n", want: "fixes.invalid-drop.enabled"},
		{name: "zero sync period", file: "syncPeriod: 0s\n", want: "syncPeriod"},
		{name: "memory limit not a quantity", env: []string{"NNM_MEMORY_LIMIT=lots"}, want: "memoryLimit"},
		{name: "memory limit zero", args: []string{"--memory-limit", "0"}, want: "memoryLimit"},
		{name: "bad --set", args: []string{"--set", "nokeyvalue"}, want: "--set"},
		{name: "yaml syntax", file: "backend: [unclosed\n", want: "config file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, c.file, c.env, c.args, c.want) })
	}
}

// wantLoadError loads file (when not empty), env and args and wants an error containing every want.
func wantLoadError(t *testing.T, file string, env, args []string, want ...string) {
	t.Helper()
	if file != "" {
		args = append(args, "--config", writeFile(t, file))
	}
	_, err := Load(flags(t, args...), env, ids)
	if err == nil {
		t.Fatal("expected an error")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// TestMemoryLimit: the downward API's bytes and a quantity give the same limit; none gives 0 (the
// DaemonSet's, fix.MemoryLimit).
func TestMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "134217728": 128 << 20, "256Mi": 256 << 20, "1G": 1e9} {
		c, err := Load(flags(t), []string{"NNM_MEMORY_LIMIT=" + in}, ids)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got, err := c.ParsedMemoryLimit(); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestFixFlags(t *testing.T) {
	cfg, err := Load(flags(t, "--enable-fix", "ipvs-externalip-dnat", "--disable-fix", "invalid-drop",
		"--set", "fixes.ipvs-externalip-dnat.masqueradeMark=0x8000"), nil, ids)
	if err != nil {
		t.Fatal(err)
	}
	if on, _ := cfg.FixEnabled("ipvs-externalip-dnat"); !on {
		t.Error("--enable-fix ignored")
	}
	if on, set := cfg.FixEnabled("invalid-drop"); on || !set {
		t.Error("--disable-fix ignored")
	}
	if cfg.FixOptions("ipvs-externalip-dnat")["masquerademark"] != "0x8000" {
		t.Errorf("--set ignored: %#v", cfg.FixOptions("ipvs-externalip-dnat"))
	}
}

func TestEnvName(t *testing.T) {
	for key, want := range map[string]string{
		"minSyncPeriod":              "NNM_MIN_SYNC_PERIOD",
		"podCIDRs":                   "NNM_POD_CIDRS",
		"fixes.invalid-drop.enabled": "NNM_FIXES_INVALID_DROP_ENABLED",
		"iptablesVariant":            "NNM_IPTABLES_VARIANT",
	} {
		if got := EnvName(key); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestEnableAndDisableSameFixIsAnError(t *testing.T) {
	_, err := Load(flags(t, "--enable-fix", "invalid-drop", "--disable-fix", "invalid-drop"), nil, ids)
	if err == nil || !strings.Contains(err.Error(), "invalid-drop") {
		t.Fatalf("want an error naming the fix, got %v", err)
	}
}

func TestLegacyPodCIDRsBeatTheFile(t *testing.T) {
	file := writeFile(t, "podCIDRs: [10.0.0.0/24]\n")
	cfg, err := Load(flags(t, "--config", file), []string{"POD_CIDR_IPV4=10.244.7.0/24"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.PodCIDRs) != 1 || cfg.PodCIDRs[0] != "10.244.7.0/24" {
		t.Fatalf("the legacy variable (environment) must beat the file: %v", cfg.PodCIDRs)
	}
	cfg, err = Load(flags(t, "--config", file), []string{"POD_CIDR_IPV4=10.244.7.0/24", "NNM_POD_CIDRS=10.244.9.0/24"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PodCIDRs[0] != "10.244.9.0/24" {
		t.Fatalf("NNM_POD_CIDRS must beat the legacy variable: %v", cfg.PodCIDRs)
	}
}

func TestUnknownEnvironmentIsWarned(t *testing.T) {
	cfg, err := Load(nil, []string{"NNM_SYNC_PERIODS=5s", "NNM_FIXES_NO_SUCH_FIX_ENABLED=true", "NNM_SYNC_PERIOD=5s", "NNM_FIXES_INVALID_DROP_ENABLED=true"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	w := strings.Join(cfg.Warnings, "\n")
	if !strings.Contains(w, "NNM_SYNC_PERIODS") || !strings.Contains(w, "NNM_FIXES_NO_SUCH_FIX_ENABLED") || len(cfg.Warnings) != 2 {
		t.Fatalf("want warnings for exactly the two unknown variables, got %q", cfg.Warnings)
	}
}

// A config path that is not a regular file, or is larger than a ConfigMap can be, is refused before
// it is read (#19): a FIFO used to block Load forever, a 1 GB file was read whole.
func TestConfigFileMustBeARegularFileOfAtMost1MiB(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml") // sparse: no disk used
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<30); err != nil {
		t.Fatal(err)
	}
	justOver := filepath.Join(dir, "over.yaml")
	if err := os.WriteFile(justOver, []byte("backend: nftables\n#"+strings.Repeat("x", MaxFileSize)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	atLimit := filepath.Join(dir, "at.yaml")
	body := "backend: nftables\n#"
	if err := os.WriteFile(atLimit, []byte(body+strings.Repeat("x", MaxFileSize-len(body)-1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path, want string }{
		{"fifo", fifo, "config file " + fifo + ": not a regular file (a FIFO); accepted: a YAML file of at most 1 MiB"},
		{"directory", dir, "config file " + dir + ": not a regular file (a directory); accepted: a YAML file of at most 1 MiB"},
		{"1 GiB", huge, "config file " + huge + ": 1073741824 bytes; accepted: a YAML file of at most 1 MiB (what a ConfigMap holds)"},
		{"1 MiB + 1", justOver, fmt.Sprintf("config file %s: %d bytes; accepted: a YAML file of at most 1 MiB (what a ConfigMap holds)", justOver, MaxFileSize+20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { _, err := Load(flags(t, "--config", c.path), nil, ids); done <- err }()
			select {
			case err := <-done:
				if err == nil || err.Error() != c.want {
					t.Fatalf("got %v\nwant %s", err, c.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Load did not return within 10s (it blocks on the path)")
			}
		})
	}
	cfg, err := Load(flags(t, "--config", atLimit), nil, ids)
	if err != nil || cfg.Backend != "nftables" {
		t.Fatalf("a file of exactly 1 MiB must load: %v", err)
	}
}
