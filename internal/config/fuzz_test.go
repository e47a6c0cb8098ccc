package config

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/spf13/pflag"
)

// FuzzLoadFile: any config file content loads or is refused with an error, never a panic, and a
// file that loads gives the same configuration every time.
func FuzzLoadFile(f *testing.F) {
	for _, s := range []string{
		"",
		"backend: nftables\nsyncPeriod: 30s\nfamilies: [ipv4, ipv6]\n",
		"fixes:\n  invalid-drop:\n    enabled: true\n    hooks: [input, forward]\n    exemptSourceCIDRs: 192.0.2.0/24,2001:db8::/32\n",
		"fixes:\n  ipvs-externalip-dnat: {enabled: false}\npodCIDRs: [10.244.0.0/16]\n",
		"families: [ipv4\n",
		"[\"x\"]\n",
		"syncPeriod: -1s\nminSyncPeriod: 1h\n",
		"fixes: 3\n",
		"a: &x [*x]\n",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, body string) {
		file := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		load := func() (*Config, error) {
			fs := pflag.NewFlagSet("fuzz", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse([]string{"--config", file}); err != nil {
				t.Fatal(err)
			}
			return Load(fs, nil, ids)
		}
		cfg, err := load()
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error message")
			}
			return
		}
		again, err := load()
		if err != nil || !reflect.DeepEqual(cfg, again) {
			t.Fatalf("loading the same file twice: %+v, then %+v (%v)", cfg, again, err)
		}
	})
}
