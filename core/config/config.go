// Package config loads the agent's configuration with viper from a file, the environment (NNM_…) and
// flags, in rising order of precedence, and validates it strictly: an unknown key or a value that does
// not parse stops start-up with an error that names the key.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Config is the agent's configuration. Keys are camelCase in files; the environment uses NNM_ and
// upper snake case (minSyncPeriod → NNM_MIN_SYNC_PERIOD, fixes.invalid-drop.enabled →
// NNM_FIXES_INVALID_DROP_ENABLED); flags use kebab case (--min-sync-period).
type Config struct {
	// NodeName is this node's name (the DaemonSet sets it from the downward API).
	NodeName string `mapstructure:"nodeName"`
	// Kubeconfig is a kubeconfig path; empty means in-cluster.
	Kubeconfig string `mapstructure:"kubeconfig"`
	// Backend is auto, iptables or nftables.
	Backend string `mapstructure:"backend"`
	// IptablesVariant is auto, nft or legacy.
	IptablesVariant string `mapstructure:"iptablesVariant"`
	// ProxyMode is kube-proxy's mode: auto, ipvs, iptables or nftables.
	ProxyMode string `mapstructure:"proxyMode"`
	// Families are the IP families to program: ipv4, ipv6.
	Families []string `mapstructure:"families"`
	// PodCIDRs are used when the Node object has no spec.podCIDRs.
	PodCIDRs []string `mapstructure:"podCIDRs"`
	// MinSyncPeriod is the shortest time between two syncs; changes in between are coalesced.
	MinSyncPeriod time.Duration `mapstructure:"minSyncPeriod"`
	// SyncPeriod is the time between full resyncs that repair rules changed behind our back.
	SyncPeriod time.Duration `mapstructure:"syncPeriod"`
	// MetricsAddress serves /metrics, /healthz and /readyz; empty disables the server.
	MetricsAddress string `mapstructure:"metricsAddress"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `mapstructure:"logLevel"`
	// Fixes holds one section per fix id: "enabled" plus the fix's own options.
	Fixes map[string]map[string]any `mapstructure:"fixes"`

	// File is the config file that was read ("" for none). Not a config key.
	File string `mapstructure:"-"`
	// Warnings are problems that do not stop start-up (e.g. an NNM_ variable that is no config key:
	// the test harnesses set some of their own), logged by the agent at start.
	Warnings []string `mapstructure:"-"`
}

// Defaults returns the configuration used when nothing is set.
func Defaults() Config {
	return Config{
		Backend:         "auto",
		IptablesVariant: "auto",
		ProxyMode:       "auto",
		Families:        []string{"ipv4", "ipv6"},
		MinSyncPeriod:   time.Second,
		SyncPeriod:      30 * time.Second,
		MetricsAddress:  "0.0.0.0:9484",
		LogLevel:        "info",
	}
}

// keys lists the top-level keys in file spelling with their flag names and help text.
var keys = []struct {
	key, flag, help string
}{
	{"nodeName", "node-name", "this node's name (downward API spec.nodeName)"},
	{"kubeconfig", "kubeconfig", "kubeconfig file; empty for in-cluster config"},
	{"backend", "backend", "rule backend: auto, iptables or nftables"},
	{"iptablesVariant", "iptables-variant", "iptables variant: auto, nft or legacy"},
	{"proxyMode", "proxy-mode", "kube-proxy mode: auto, ipvs, iptables or nftables"},
	{"families", "families", "IP families to program (ipv4,ipv6)"},
	{"podCIDRs", "pod-cidrs", "pod CIDRs of this node when the Node object has none"},
	{"minSyncPeriod", "min-sync-period", "shortest time between two syncs"},
	{"syncPeriod", "sync-period", "time between full resyncs"},
	{"metricsAddress", "metrics-address", "address for /metrics, /healthz, /readyz (empty: off)"},
	{"logLevel", "log-level", "debug, info, warn or error"},
}

// Legacy environment variables of the predecessor (Kakao network-node-manager), honoured so that
// users can migrate without editing their manifests.
const (
	LegacyPodCIDRv4         = "POD_CIDR_IPV4"
	LegacyPodCIDRv6         = "POD_CIDR_IPV6"
	LegacyInvalidDrop       = "RULE_DROP_INVALID_INPUT_ENABLE"
	LegacyExternalClusterIP = "RULE_EXTERNAL_CLUSTER_ENABLE"
)

var legacyFixEnv = map[string]string{
	"invalid-drop":         LegacyInvalidDrop,
	"ipvs-externalip-dnat": LegacyExternalClusterIP,
}

// EnvName is the environment variable of a key path, e.g. "fixes.invalid-drop.enabled" →
// NNM_FIXES_INVALID_DROP_ENABLED and "minSyncPeriod" → NNM_MIN_SYNC_PERIOD.
func EnvName(key string) string {
	var b strings.Builder
	b.WriteString("NNM_")
	prevLower := false
	for _, r := range key {
		switch {
		case r == '.' || r == '-':
			b.WriteByte('_')
			prevLower = false
		case r >= 'A' && r <= 'Z':
			if prevLower {
				b.WriteByte('_')
			}
			b.WriteRune(r)
			prevLower = false
		default:
			b.WriteString(strings.ToUpper(string(r)))
			prevLower = r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		}
	}
	return b.String()
}

// AddFlags registers the configuration flags (and --config, --set) on fs.
func AddFlags(fs *pflag.FlagSet) {
	d := Defaults()
	fs.String("config", "", "configuration file (YAML)")
	fs.String("node-name", d.NodeName, keyHelp("nodeName"))
	fs.String("kubeconfig", d.Kubeconfig, keyHelp("kubeconfig"))
	fs.String("backend", d.Backend, keyHelp("backend"))
	fs.String("iptables-variant", d.IptablesVariant, keyHelp("iptablesVariant"))
	fs.String("proxy-mode", d.ProxyMode, keyHelp("proxyMode"))
	fs.StringSlice("families", d.Families, keyHelp("families"))
	fs.StringSlice("pod-cidrs", nil, keyHelp("podCIDRs"))
	fs.Duration("min-sync-period", d.MinSyncPeriod, keyHelp("minSyncPeriod"))
	fs.Duration("sync-period", d.SyncPeriod, keyHelp("syncPeriod"))
	fs.String("metrics-address", d.MetricsAddress, keyHelp("metricsAddress"))
	fs.String("log-level", d.LogLevel, keyHelp("logLevel"))
	fs.StringSlice("enable-fix", nil, "enable these fixes (ids), overriding file and environment")
	fs.StringSlice("disable-fix", nil, "disable these fixes (ids), overriding file and environment")
	fs.StringArray("set", nil, "set any key, e.g. --set fixes.invalid-drop.hooks=input,forward")
}

func keyHelp(key string) string {
	for _, k := range keys {
		if k.key == key {
			return fmt.Sprintf("%s (env %s)", k.help, EnvName(key))
		}
	}
	return ""
}

// Load reads the configuration. fixIDs are the registered fixes: a fixes.<id> section for any other
// id is an error. fs may be nil (no flags); environ is os.Environ() in production.
func Load(fs *pflag.FlagSet, environ []string, fixIDs []string) (*Config, error) {
	v := viper.New()
	v.SetConfigType("yaml")
	d := Defaults()
	v.SetDefault("backend", d.Backend)
	v.SetDefault("iptablesVariant", d.IptablesVariant)
	v.SetDefault("proxyMode", d.ProxyMode)
	v.SetDefault("families", d.Families)
	v.SetDefault("minSyncPeriod", d.MinSyncPeriod.String())
	v.SetDefault("syncPeriod", d.SyncPeriod.String())
	v.SetDefault("metricsAddress", d.MetricsAddress)
	v.SetDefault("logLevel", d.LogLevel)

	file := ""
	if fs != nil {
		if f := fs.Lookup("config"); f != nil {
			file = f.Value.String()
		}
	}
	if file == "" {
		file = lookupEnv(environ, "NNM_CONFIG")
	}
	if file != "" {
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}

	// Environment: every known key, and any NNM_FIXES_<ID>_<OPTION> variable.
	env := envMap(environ)
	for _, k := range keys {
		if val, ok := env[EnvName(k.key)]; ok {
			v.Set(k.key, splitIfList(k.key, val))
		}
	}
	for _, id := range fixIDs {
		prefix := EnvName("fixes."+id) + "_"
		for name, val := range env {
			if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
				v.Set("fixes."+id+"."+strings.ToLower(strings.ReplaceAll(rest, "_", "")), val)
			}
		}
	}
	if err := applyLegacyEnv(v, env); err != nil {
		return nil, err
	}

	// Flags that were set on the command line.
	if fs != nil {
		for _, k := range keys {
			if f := fs.Lookup(k.flag); f != nil && f.Changed {
				v.Set(k.key, flagValue(f))
			}
		}
		if err := applyFixFlags(v, fs); err != nil {
			return nil, err
		}
	}

	if err := checkKeys(v, fixIDs); err != nil {
		return nil, err
	}
	cfg := Defaults()
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:           &cfg,
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		MatchName:        func(key, field string) bool { return strings.EqualFold(key, field) },
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		),
	})
	if err != nil {
		return nil, err
	}
	if err := dec.Decode(v.AllSettings()); err != nil {
		return nil, fmt.Errorf("config: %w", fix.DecodeError(err))
	}
	cfg.File = file
	cfg.Warnings = unknownEnv(env, fixIDs)
	cfg.Fixes = normalizeFixes(cfg.Fixes, fixIDs)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func envMap(environ []string) map[string]string {
	m := map[string]string{}
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok {
			m[k] = val
		}
	}
	return m
}

func lookupEnv(environ []string, name string) string { return envMap(environ)[name] }

func splitIfList(key, val string) any {
	if key == "families" || key == "podCIDRs" {
		return splitList(val)
	}
	return val
}

func splitList(val string) []string {
	var out []string
	for _, s := range strings.Split(val, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func flagValue(f *pflag.Flag) any {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return sv.GetSlice()
	}
	return f.Value.String()
}

func applyLegacyEnv(v *viper.Viper, env map[string]string) error {
	// The legacy variables are environment: they beat the file, and NNM_POD_CIDRS and flags beat them.
	if env[EnvName("podCIDRs")] == "" {
		var cidrs []string
		for _, name := range []string{LegacyPodCIDRv4, LegacyPodCIDRv6} {
			if val := strings.TrimSpace(env[name]); val != "" {
				cidrs = append(cidrs, splitList(val)...)
			}
		}
		if len(cidrs) > 0 {
			v.Set("podCIDRs", cidrs)
		}
	}
	for id, name := range legacyFixEnv {
		val, ok := env[name]
		if !ok || env[EnvName("fixes."+id+".enabled")] != "" {
			continue
		}
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("config: environment %s=%q is not true or false", name, val)
		}
		v.Set("fixes."+id+".enabled", b)
	}
	return nil
}

func applyFixFlags(v *viper.Viper, fs *pflag.FlagSet) error {
	named := map[string]string{}
	for _, flag := range []string{"enable-fix", "disable-fix"} {
		if f := fs.Lookup(flag); f != nil && f.Changed {
			for _, id := range f.Value.(pflag.SliceValue).GetSlice() {
				if other, ok := named[id]; ok && other != flag {
					return fmt.Errorf("config: fix %q is named by both --enable-fix and --disable-fix", id)
				}
				named[id] = flag
				v.Set("fixes."+id+".enabled", flag == "enable-fix")
			}
		}
	}
	if f := fs.Lookup("set"); f != nil && f.Changed {
		for _, kv := range f.Value.(pflag.SliceValue).GetSlice() {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("config: --set %q: want key=value", kv)
			}
			v.Set(strings.TrimSpace(k), val)
		}
	}
	return nil
}

// checkKeys rejects keys that are not configuration keys, naming them.
func checkKeys(v *viper.Viper, fixIDs []string) error {
	known := map[string]bool{}
	for _, k := range keys {
		known[strings.ToLower(k.key)] = true
	}
	var unknown []string
	for _, key := range v.AllKeys() {
		top, rest, _ := strings.Cut(key, ".")
		if top == "fixes" {
			id, _, _ := strings.Cut(rest, ".")
			if !slices.Contains(fixIDs, id) {
				fixIDs = slices.Sorted(slices.Values(fixIDs))
				return fmt.Errorf("config: fixes.%s: unknown fix %q (registered fixes: %s)", id, id, strings.Join(fixIDs, ", "))
			}
			continue
		}
		if !known[top] {
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("config: unknown key %s", strings.Join(unknown, ", "))
	}
	return nil
}

// normalizeFixes makes sure every registered fix has a (possibly empty) section.
func normalizeFixes(in map[string]map[string]any, fixIDs []string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, id := range fixIDs {
		out[id] = map[string]any{}
		for k, val := range in[id] {
			out[id][k] = val
		}
	}
	return out
}

// Validate checks values that decoding alone does not.
func (c *Config) Validate() error {
	oneOf := func(key, val string, allowed ...string) error {
		if !slices.Contains(allowed, val) {
			return fmt.Errorf("config: %s: %q is not one of %s", key, val, strings.Join(allowed, ", "))
		}
		return nil
	}
	if err := oneOf("backend", c.Backend, "auto", "iptables", "nftables"); err != nil {
		return err
	}
	if err := oneOf("iptablesVariant", c.IptablesVariant, "auto", "nft", "legacy"); err != nil {
		return err
	}
	if err := oneOf("proxyMode", c.ProxyMode, "auto", "ipvs", "iptables", "nftables"); err != nil {
		return err
	}
	if err := oneOf("logLevel", c.LogLevel, "debug", "info", "warn", "error"); err != nil {
		return err
	}
	if len(c.Families) == 0 {
		return fmt.Errorf("config: families: at least one of ipv4, ipv6 is needed")
	}
	for _, f := range c.Families {
		if _, err := rules.ParseFamily(f); err != nil {
			return fmt.Errorf("config: families: %w", err)
		}
	}
	if _, err := c.ParsedPodCIDRs(); err != nil {
		return err
	}
	if c.MinSyncPeriod < 0 {
		return fmt.Errorf("config: minSyncPeriod: %s is negative", c.MinSyncPeriod)
	}
	if c.SyncPeriod <= 0 {
		return fmt.Errorf("config: syncPeriod: %s must be positive", c.SyncPeriod)
	}
	for id, section := range c.Fixes {
		if val, ok := section["enabled"]; ok {
			if _, err := parseBool(val); err != nil {
				return fmt.Errorf("config: fixes.%s.enabled: %w", id, err)
			}
		}
	}
	return nil
}

// ParsedFamilies returns the configured families in canonical order.
func (c *Config) ParsedFamilies() []rules.Family {
	var out []rules.Family
	for _, f := range rules.Families {
		for _, s := range c.Families {
			if g, err := rules.ParseFamily(s); err == nil && g == f && !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

// ParsedPodCIDRs parses podCIDRs.
func (c *Config) ParsedPodCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range c.PodCIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("config: podCIDRs: %q is not a CIDR", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// FixEnabled returns the explicit enabled setting of a fix, and whether there is one.
func (c *Config) FixEnabled(id string) (enabled, set bool) {
	val, ok := c.Fixes[id]["enabled"]
	if !ok {
		return false, false
	}
	b, err := parseBool(val)
	return b, err == nil
}

// FixOptions returns the options of a fix without "enabled".
func (c *Config) FixOptions(id string) map[string]any {
	out := map[string]any{}
	for k, val := range c.Fixes[id] {
		if !strings.EqualFold(k, "enabled") {
			out[k] = val
		}
	}
	return out
}

func parseBool(val any) (bool, error) {
	switch b := val.(type) {
	case bool:
		return b, nil
	case string:
		p, err := strconv.ParseBool(strings.TrimSpace(b))
		if err != nil {
			return false, fmt.Errorf("%q is not true or false", b)
		}
		return p, nil
	}
	return false, fmt.Errorf("%v is not true or false", val)
}

// Environ is os.Environ, a variable so that callers read the process environment in one place.
var Environ = os.Environ

// unknownEnv lists NNM_ variables that are no configuration key, e.g. a misspelt NNM_SYNC_PERIODS.
func unknownEnv(env map[string]string, fixIDs []string) []string {
	known := map[string]bool{"NNM_CONFIG": true}
	for _, k := range keys {
		known[EnvName(k.key)] = true
	}
	var out []string
	for name := range env {
		if !strings.HasPrefix(name, "NNM_") || known[name] {
			continue
		}
		isFix := false
		for _, id := range fixIDs {
			if strings.HasPrefix(name, EnvName("fixes."+id)+"_") {
				isFix = true
			}
		}
		if !isFix {
			out = append(out, fmt.Sprintf("environment variable %s is not a configuration key; ignored", name))
		}
	}
	sort.Strings(out)
	return out
}
