package config

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// readmeRow is the README's configuration-table row of a key, as Keys says it must be.
func readmeRow(k Key) string {
	def := k.Doc
	switch d := k.Default.(type) {
	case string:
		if d != "" {
			def = "`" + d + "`"
		}
	case []string:
		if len(d) > 0 {
			def = "`" + strings.Join(d, ",") + "`"
		}
	case time.Duration:
		def = "`" + d.String() + "`"
	case bool:
		def = fmt.Sprintf("`%t`", d)
	}
	change := "reload"
	if k.Restart {
		change = "restart"
	}
	kind := "scalar"
	if k.List() {
		kind = "list"
	}
	return fmt.Sprintf("| `%s` | `--%s` | `%s` | %s | %s | %s | %s |", k.Key, k.Flag, k.Env(), kind, def, change, k.Help)
}

// TestREADMETable: the README's configuration table is the Keys table, row by row.
func TestREADMETable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| `") && !strings.HasPrefix(line, "| `fixes.") && strings.Count(line, "|") == 8 && strings.Contains(line, "`NNM_") {
			got = append(got, line)
		}
	}
	var want []string
	for _, k := range Keys {
		want = append(want, readmeRow(k))
	}
	if !slices.Equal(got, want) {
		t.Errorf("README.md's configuration table differs from config.Keys; the rows must be:\n%s\n\ngot:\n%s",
			strings.Join(want, "\n"), strings.Join(got, "\n"))
	}
}

// TestKeysMakeFlagsAndDefaults: every key has its flag with the key's default, and Defaults holds it.
func TestKeysMakeFlagsAndDefaults(t *testing.T) {
	fs := flags(t)
	d := fieldsByKey(ptr(Defaults()))
	for _, k := range Keys {
		f := fs.Lookup(k.Flag)
		if f == nil {
			t.Errorf("%s: no flag --%s", k.Key, k.Flag)
			continue
		}
		if !strings.Contains(f.Usage, k.Env()) {
			t.Errorf("--%s: help %q does not name %s", k.Flag, f.Usage, k.Env())
		}
		got, ok := d[k.Key]
		if !ok {
			t.Errorf("%s: no Config field with this mapstructure tag", k.Key)
			continue
		}
		if fmt.Sprint(got.Interface()) != fmt.Sprint(k.Default) {
			t.Errorf("Defaults().%s = %v, want %v", k.Key, got.Interface(), k.Default)
		}
	}
	if len(d) != len(Keys)+1 { // + fixes
		t.Errorf("Config has %d keyed fields, Keys %d (+ fixes): a field without a row in Keys", len(d), len(Keys))
	}
}

func ptr[T any](v T) *T { return &v }

func TestRestartOnly(t *testing.T) {
	a, b := Defaults(), Defaults()
	b.Backend, b.SyncPeriod, b.MetricsAddress = "nftables", time.Minute, ""
	if got := RestartOnly(&a, &b); !slices.Equal(got, []string{"backend", "metricsAddress"}) {
		t.Errorf("RestartOnly = %v, want [backend metricsAddress] (syncPeriod is reloaded)", got)
	}
	if got := RestartOnly(&a, &a); len(got) != 0 {
		t.Errorf("RestartOnly of equal configs = %v", got)
	}
}

// Errors about a file that is not ours name the file and a line, never its content (#15 item 6).
func TestConfigErrorsDoNotEchoTheFile(t *testing.T) {
	for name, body := range map[string]string{
		"shadow":      "root:$6$SECRETSALT$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
		"ini":         "[default]\naws_access_key_id = AKIASECRET\naws_secret_access_key = SECRETKEY\n",
		"scalar":      "SECRETTOKEN\n",
		"htpasswd":    "admin:$apr1$SECRET$hash\n",
		"broken yaml": "families: [ipv4\n  SECRET: x\n",
		"json array":  "[\"SECRET\"]\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(flags(t, "--config", writeFile(t, body)), nil, ids)
			if err == nil {
				t.Fatal("want an error")
			}
			if strings.Contains(strings.ToUpper(err.Error()), "SECRET") {
				t.Errorf("the error echoes the file: %v", err)
			}
			if !strings.Contains(err.Error(), "line ") {
				t.Errorf("the error names no line: %v", err)
			}
		})
	}
	// A key of ours that is wrong is still named, with its line.
	_, err := Load(flags(t, "--config", writeFile(t, "backend: nftables\nbakend: iptables\n")), nil, ids)
	if err == nil || !strings.Contains(err.Error(), "bakend (line 2)") {
		t.Errorf("unknown key: %v, want it named with line 2", err)
	}
	_, err = Load(flags(t, "--config", writeFile(t, "\nsyncPeriod: soon\n")), nil, ids)
	if err == nil || !strings.Contains(err.Error(), "syncPeriod (line 2)") {
		t.Errorf("bad value: %v, want syncPeriod named with line 2", err)
	}
}

// Values that used to be taken silently are refused, naming the key (#15 item 7).
func TestSilentAcceptanceIsRefused(t *testing.T) {
	for _, c := range []struct {
		name, file string
		env        []string
		args       []string
		want       []string
	}{
		{name: "IPv6 in POD_CIDR_IPV4", env: []string{"POD_CIDR_IPV4=fd00:10:244:1::/64"}, want: []string{"POD_CIDR_IPV4", "not an ipv4 CIDR"}},
		{name: "IPv4 in POD_CIDR_IPV6", env: []string{"POD_CIDR_IPV6=10.244.1.0/24"}, want: []string{"POD_CIDR_IPV6", "not an ipv6 CIDR"}},
		{name: "host bits in podCIDRs", file: "podCIDRs: [10.244.1.1/24]\n", want: []string{"podCIDRs (line 1)", "did you mean 10.244.1.0/24"}},
		{name: "host bits in NNM_POD_CIDRS", env: []string{"NNM_POD_CIDRS=fd00::1/64"}, want: []string{"podCIDRs", "did you mean fd00::/64"}},
		{name: "host bits in POD_CIDR_IPV4", env: []string{"POD_CIDR_IPV4=10.244.1.1/24"}, want: []string{"POD_CIDR_IPV4", "host bits"}},
		{name: "minSyncPeriod above syncPeriod", file: "syncPeriod: 10s\nminSyncPeriod: 1m\n", want: []string{"minSyncPeriod", "syncPeriod"}},
		{name: "minSyncPeriod flag above syncPeriod", args: []string{"--min-sync-period", "31s"}, want: []string{"minSyncPeriod"}},
		{name: "empty families list", file: "families: []\n", want: []string{"families", "empty"}},
		{name: "families without a value", file: "families:\n", want: []string{"families", "empty"}},
		{name: "empty NNM_FAMILIES", env: []string{"NNM_FAMILIES="}, want: []string{"families", "empty"}},
		{name: "empty --families", args: []string{"--families="}, want: []string{"families", "empty"}},
	} {
		t.Run(c.name, func(t *testing.T) { wantLoadError(t, c.file, c.env, c.args, c.want...) })
	}
}

// The standard KUBECONFIG variable is read into KubeconfigPaths (client-go's loading rules).
func TestKubeconfigVariable(t *testing.T) {
	cfg, err := Load(nil, []string{"KUBECONFIG=/a/one" + string(os.PathListSeparator) + "/b/two"}, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.KubeconfigPaths, []string{"/a/one", "/b/two"}) {
		t.Errorf("KubeconfigPaths = %v", cfg.KubeconfigPaths)
	}
}
