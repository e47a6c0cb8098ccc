// Package config loads the agent's configuration with viper from a file, the environment (NNM_…) and
// flags, in rising order of precedence, and validates it strictly: an unknown key or a value that does
// not parse stops start-up with an error that names the key.
package config

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/logging"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Config is the agent's configuration. Keys are camelCase in files; the environment uses NNM_ and
// upper snake case (minSyncPeriod → NNM_MIN_SYNC_PERIOD, fixes.invalid-drop.enabled →
// NNM_FIXES_INVALID_DROP_ENABLED); flags use kebab case (--min-sync-period).
type Config struct {
	// NodeName is this node's name (the DaemonSet sets it from the downward API).
	NodeName string `mapstructure:"nodeName"`
	// Kubeconfig is a kubeconfig path; empty means KubeconfigPaths, else in-cluster.
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
	// MetricsAddress serves /metrics (and the probes when HealthzAddress is empty); empty disables it.
	MetricsAddress string `mapstructure:"metricsAddress"`
	// MetricsSecure serves /metrics over HTTPS to clients whose bearer token the API server
	// authenticates (TokenReview) and authorizes for get on the non-resource URL /metrics
	// (SubjectAccessReview).
	MetricsSecure bool `mapstructure:"metricsSecure"`
	// MetricsCertDir holds tls.crt and tls.key for the HTTPS metrics; empty means a self-signed
	// certificate generated at start.
	MetricsCertDir string `mapstructure:"metricsCertDir"`
	// HealthzAddress serves /healthz and /readyz over plain HTTP; empty serves them on MetricsAddress.
	HealthzAddress string `mapstructure:"healthzAddress"`
	// ProcSysPath is where the agent reads and writes sysctls (/proc/sys). A container's /proc/sys is
	// read-only, so deploy/base mounts the node's /proc/sys/net at /host/proc/sys/net and sets this.
	ProcSysPath string `mapstructure:"procSysPath"`
	// LogLevel is debug, info, warn or error; a reload applies it.
	LogLevel string `mapstructure:"logLevel"`
	// LogFormat is text or json (core/logging).
	LogFormat string `mapstructure:"logFormat"`
	// Fixes holds one section per fix id: "enabled" plus the fix's own options.
	Fixes map[string]map[string]any `mapstructure:"fixes"`

	// File is the config file that was read ("" for none). Not a config key.
	File string `mapstructure:"-"`
	// KubeconfigPaths are the files of the standard KUBECONFIG variable (client-go's loading rules:
	// the kubeconfig key, then these, then the in-cluster config). Not a config key.
	KubeconfigPaths []string `mapstructure:"-"`
	// Warnings are problems that do not stop start-up (e.g. an NNM_ variable that is no config key:
	// the test harnesses set some of their own), logged by the agent at start.
	Warnings []string `mapstructure:"-"`
}

// Key is one top-level configuration key. Keys is the one table from which the flags, the
// environment names, the defaults, the decoding of lists, the restart-only set and the README's
// configuration table come (TestREADMETable compares them).
type Key struct {
	// Key is the file spelling; the Config field with this mapstructure tag holds the value.
	Key string
	// Flag is the command-line flag (kebab case).
	Flag string
	// Default is the value when nothing is set: a string, a []string (a list key: comma-separated in
	// the environment and flags) or a time.Duration.
	Default any
	// Doc replaces an empty default in the README (e.g. "in-cluster").
	Doc string
	// Restart marks keys that a reloaded file cannot change: the agent logs that a restart is needed.
	Restart bool
	// Help is the flag's help text and the README's "meaning" (with `code` marks there).
	Help string
}

// Env is the key's environment variable.
func (k Key) Env() string { return EnvName(k.Key) }

// List reports whether the key holds a list.
func (k Key) List() bool { _, ok := k.Default.([]string); return ok }

// Keys are the top-level keys in the order of the README's table.
var Keys = []Key{
	{Key: "nodeName", Flag: "node-name", Default: "", Restart: true, Help: "this node (downward API)"},
	{Key: "kubeconfig", Flag: "kubeconfig", Default: "", Doc: "`KUBECONFIG`, else in-cluster", Restart: true,
		Help: "API access: this file, else the files in the standard KUBECONFIG variable, else the in-cluster config"},
	{Key: "backend", Flag: "backend", Default: "auto", Restart: true, Help: "`iptables`, `nftables`; auto follows kube-proxy"},
	{Key: "iptablesVariant", Flag: "iptables-variant", Default: "auto", Restart: true, Help: "`nft`, `legacy`; auto follows kubelet's `KUBE-IPTABLES-HINT`"},
	{Key: "proxyMode", Flag: "proxy-mode", Default: "auto", Restart: true, Help: "`ipvs`, `iptables`, `nftables`; auto asks kube-proxy"},
	{Key: "families", Flag: "families", Default: []string{"ipv4", "ipv6"}, Help: "families to program"},
	{Key: "podCIDRs", Flag: "pod-cidrs", Default: []string{}, Help: "used when the Node has no `spec.podCIDRs`"},
	{Key: "minSyncPeriod", Flag: "min-sync-period", Default: time.Second, Help: "coalescing of changes; at most `syncPeriod`"},
	{Key: "syncPeriod", Flag: "sync-period", Default: 30 * time.Second, Help: "full resync that repairs drift"},
	{Key: "metricsAddress", Flag: "metrics-address", Default: "0.0.0.0:9484", Restart: true, Help: "`/metrics`, and the probes when `healthzAddress` is empty; empty: off"},
	{Key: "metricsSecure", Flag: "metrics-secure", Default: false, Restart: true,
		Help: "`/metrics` over HTTPS for bearer tokens the API server authenticates (TokenReview) and authorizes for get `/metrics` (SubjectAccessReview); `true` in deploy/base"},
	{Key: "metricsCertDir", Flag: "metrics-cert-dir", Default: "", Doc: "self-signed", Restart: true,
		Help: "directory with `tls.crt` and `tls.key` for the HTTPS metrics (re-read when they change)"},
	{Key: "healthzAddress", Flag: "healthz-address", Default: "", Doc: "on `metricsAddress`", Restart: true,
		Help: "`/healthz`, `/readyz` over plain HTTP (`0.0.0.0:9485` in deploy/base)"},
	{Key: "procSysPath", Flag: "proc-sys-path", Default: "/proc/sys", Restart: true,
		Help: "the sysctl tree the agent writes; a container's `/proc/sys` is read-only, so deploy/base mounts the node's `/proc/sys/net` at `/host/proc/sys/net`"},
	{Key: "logLevel", Flag: "log-level", Default: "info", Help: "`debug`, `info`, `warn`, `error`"},
	{Key: "logFormat", Flag: "log-format", Default: "text", Restart: true, Help: "`text`, `json`; client-go's log lines use it too"},
}

// Defaults returns the configuration used when nothing is set.
func Defaults() Config {
	var c Config
	m := map[string]any{}
	for _, k := range Keys {
		m[k.Key] = k.Default
	}
	if err := decode(m, &c); err != nil {
		panic(fmt.Sprintf("config: the defaults of Keys do not decode: %v", err))
	}
	return c
}

// RestartOnly lists the keys marked Restart whose values differ between a and b.
func RestartOnly(a, b *Config) []string {
	va, vb := fieldsByKey(a), fieldsByKey(b)
	var out []string
	for _, k := range Keys {
		if k.Restart && !reflect.DeepEqual(va[k.Key].Interface(), vb[k.Key].Interface()) {
			out = append(out, k.Key)
		}
	}
	return out
}

// fieldsByKey maps each mapstructure tag of Config to the field's value in c.
func fieldsByKey(c *Config) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	v := reflect.ValueOf(c).Elem()
	for i := 0; i < v.NumField(); i++ {
		if tag := v.Type().Field(i).Tag.Get("mapstructure"); tag != "" && tag != "-" {
			out[tag] = v.Field(i)
		}
	}
	return out
}

// decode is the one decoder for the configuration: strict (unknown keys are errors), durations from
// strings, lists from comma-separated strings (environment, --set).
func decode(in map[string]any, out *Config) error {
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:           out,
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		MatchName:        func(key, field string) bool { return strings.EqualFold(key, field) },
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			splitListHook,
		),
	})
	if err != nil {
		return err
	}
	return dec.Decode(in)
}

// splitListHook turns "a, b," into [a b] for list fields.
func splitListHook(from, to reflect.Type, data any) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return data, nil
	}
	return splitList(data.(string)), nil
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

// KubeconfigEnv is client-go's standard variable: a list of kubeconfig files, used when no
// kubeconfig key is set (clientcmd's loading rules).
const KubeconfigEnv = "KUBECONFIG"

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
	fs.String("config", "", "configuration file (YAML)")
	for _, k := range Keys {
		help := fmt.Sprintf("%s (env %s)", strings.ReplaceAll(k.Help, "`", ""), k.Env())
		switch d := k.Default.(type) {
		case string:
			fs.String(k.Flag, d, help)
		case []string:
			fs.StringSlice(k.Flag, d, help)
		case time.Duration:
			fs.Duration(k.Flag, d, help)
		case bool:
			fs.Bool(k.Flag, d, help)
		default:
			panic(fmt.Sprintf("config: key %s has a default of unsupported type %T", k.Key, d))
		}
	}
	fs.StringSlice("enable-fix", nil, "enable these fixes (ids), overriding file and environment")
	fs.StringSlice("disable-fix", nil, "disable these fixes (ids), overriding file and environment")
	fs.StringArray("set", nil, "set any key, e.g. --set fixes.invalid-drop.hooks=input,forward")
}

// Load reads the configuration. fixIDs are the registered fixes: a fixes.<id> section for any other
// id is an error. fs may be nil (no flags); environ is os.Environ() in production.
//
// viper holds the layers: defaults (from Keys), the file and the environment merged as its config
// layer (the environment after the file), flags bound with BindPFlag (they win when set), and
// --set/--enable-fix/--disable-fix as overrides. Two things are done beside it, on purpose: the file
// is parsed here rather than by viper.ReadInConfig, whose errors quote the file's content (a
// --config pointing at a credentials file would print it; ours name a line); and the environment is
// read from environ rather than by viper.BindEnv/AutomaticEnv, which read the process environment
// only (tests and the agent pass it in) and cannot map NNM_FIXES_<ID>_<OPTION> to option names no
// table knows.
func Load(fs *pflag.FlagSet, environ []string, fixIDs []string) (*Config, error) {
	v := viper.New()
	for _, k := range Keys {
		v.SetDefault(k.Key, k.Default)
	}

	file := ""
	if fs != nil {
		if f := fs.Lookup("config"); f != nil {
			file = f.Value.String()
		}
	}
	env := envMap(environ)
	if file == "" {
		file = env["NNM_CONFIG"]
	}
	var lines map[string]int
	if file != "" {
		settings, l, err := readFile(file)
		if err != nil {
			return nil, err
		}
		lines = l
		if err := v.MergeConfigMap(settings); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}

	// Environment: every known key, and any NNM_FIXES_<ID>_<OPTION> variable.
	envLayer := map[string]any{}
	for _, k := range Keys {
		if val, ok := env[k.Env()]; ok {
			envLayer[k.Key] = val
		}
	}
	fixesLayer := map[string]any{}
	for _, id := range fixIDs {
		prefix := EnvName("fixes."+id) + "_"
		section := map[string]any{}
		for name, val := range env {
			if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
				section[strings.ToLower(strings.ReplaceAll(rest, "_", ""))] = val
			}
		}
		if err := applyLegacyFixEnv(section, id, env); err != nil {
			return nil, err
		}
		if len(section) > 0 {
			fixesLayer[id] = section
		}
	}
	if len(fixesLayer) > 0 {
		envLayer["fixes"] = fixesLayer
	}
	if err := applyLegacyPodCIDRs(envLayer, env); err != nil {
		return nil, err
	}
	if err := v.MergeConfigMap(envLayer); err != nil {
		return nil, fmt.Errorf("config: environment: %w", err)
	}

	if fs != nil {
		for _, k := range Keys {
			if f := fs.Lookup(k.Flag); f != nil {
				if err := v.BindPFlag(k.Key, f); err != nil {
					return nil, fmt.Errorf("config: flag --%s: %w", k.Flag, err)
				}
			}
		}
		if err := applyFixFlags(v, fs); err != nil {
			return nil, err
		}
	}

	if err := checkKeys(v, fixIDs, lines); err != nil {
		return nil, err
	}
	cfg := Config{}
	if err := decode(v.AllSettings(), &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", withLines(fix.DecodeError(err), lines))
	}
	cfg.File = file
	cfg.KubeconfigPaths = filepath.SplitList(env[KubeconfigEnv])
	cfg.Warnings = unknownEnv(env, fixIDs)
	cfg.Fixes = normalizeFixes(cfg.Fixes, fixIDs)
	if err := cfg.Validate(); err != nil {
		return nil, withLines(err, lines)
	}
	return &cfg, nil
}

// readFile parses the config file into settings and the line of every key path (lower case, dotted).
// Errors name the file and a line, never the content: the file may not be ours.
func readFile(file string) (map[string]any, map[string]int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			return nil, nil, fmt.Errorf("config file %s: not valid YAML (line %s)", file, m[1])
		}
		return nil, nil, fmt.Errorf("config file %s: not valid YAML", file)
	}
	if len(doc.Content) == 0 {
		return map[string]any{}, nil, nil // empty file: nothing set
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("config file %s: line %d: not a YAML mapping of configuration keys", file, root.Line)
	}
	lines := map[string]int{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := strings.ToLower(prefix + n.Content[i].Value)
			lines[key] = n.Content[i].Line
			if n.Content[i+1].Kind == yaml.MappingNode {
				walk(n.Content[i+1], key+".")
			}
		}
	}
	walk(root, "")
	settings := map[string]any{}
	if err := root.Decode(&settings); err != nil {
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			return nil, nil, fmt.Errorf("config file %s: line %s: not a mapping of configuration keys", file, m[1])
		}
		return nil, nil, fmt.Errorf("config file %s: not a mapping of configuration keys", file)
	}
	// A key written without a value ("families:") is an explicitly empty value, not an absent key
	// (viper would drop it and use the default silently).
	for _, k := range Keys {
		for name, val := range settings {
			if val == nil && strings.EqualFold(name, k.Key) {
				if k.List() {
					settings[name] = []string{}
				} else {
					settings[name] = ""
				}
			}
		}
	}
	return settings, lines, nil
}

var (
	yamlLine = regexp.MustCompile(`line (\d+)`)
	// keyName is what a configuration key can look like; other "keys" (a line of a credentials
	// file that YAML read as a key) are not repeated in errors.
	keyName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// shownKey returns the key for an error message, or a placeholder when it does not look like one.
func shownKey(key string) string {
	if keyName.MatchString(key) {
		return key
	}
	return "(a key that is no configuration key name, not shown)"
}

// withLines adds the file line of the key an error starts with ("podCIDRs: ..." → "podCIDRs (line
// 3): ..."), when the key came from the file.
func withLines(err error, lines map[string]int) error {
	if err == nil || len(lines) == 0 {
		return err
	}
	msg := strings.TrimPrefix(err.Error(), "config: ")
	var key, rest string
	ok := false
	if strings.HasPrefix(msg, "'") { // mapstructure: 'syncPeriod' time: invalid duration
		key, rest, ok = strings.Cut(msg[1:], "' ")
	} else {
		key, rest, ok = strings.Cut(msg, ": ")
	}
	if line, found := lines[strings.ToLower(key)]; ok && found {
		return fmt.Errorf("config: %s (line %d): %s", key, line, rest)
	}
	return err
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

func splitList(val string) []string {
	var out []string
	for _, s := range strings.Split(val, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
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

// checkKeys rejects keys that are not configuration keys, naming them and their line in the file.
func checkKeys(v *viper.Viper, fixIDs []string, lines map[string]int) error {
	known := map[string]bool{}
	for _, k := range Keys {
		known[strings.ToLower(k.Key)] = true
	}
	where := func(key string) string {
		if line, ok := lines[key]; ok {
			return fmt.Sprintf(" (line %d)", line)
		}
		return ""
	}
	var unknown []string
	for _, key := range v.AllKeys() {
		top, rest, _ := strings.Cut(key, ".")
		if top == "fixes" {
			id, _, _ := strings.Cut(rest, ".")
			if !slices.Contains(fixIDs, id) {
				fixIDs = slices.Sorted(slices.Values(fixIDs))
				return fmt.Errorf("config: fixes.%s%s: unknown fix %q (registered fixes: %s)", shownKey(id), where("fixes."+id), shownKey(id), strings.Join(fixIDs, ", "))
			}
			continue
		}
		if !known[top] {
			unknown = append(unknown, shownKey(key)+where(key))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("config: unknown key %s", strings.Join(unknown, ", "))
	}
	return nil
}

// applyLegacyPodCIDRs sets podCIDRs from POD_CIDR_IPV4 / POD_CIDR_IPV6 unless NNM_POD_CIDRS is set.
// Each variable takes only its family's CIDRs.
func applyLegacyPodCIDRs(envLayer map[string]any, env map[string]string) error {
	if _, ok := env[EnvName("podCIDRs")]; ok {
		return nil
	}
	var cidrs []string
	for name, fam := range map[string]rules.Family{LegacyPodCIDRv4: rules.IPv4, LegacyPodCIDRv6: rules.IPv6} {
		list := splitList(env[name])
		if _, err := rules.ParsePrefixes(name, fam, list); err != nil {
			return fmt.Errorf("config: environment %w", err)
		}
		cidrs = append(cidrs, list...)
	}
	if len(cidrs) > 0 {
		sort.Strings(cidrs) // IPv4 before IPv6, whatever the map order
		envLayer["podCIDRs"] = cidrs
	}
	return nil
}

// applyLegacyFixEnv sets fixes.<id>.enabled from the predecessor's variable unless the section
// already has it from NNM_FIXES_<ID>_ENABLED.
func applyLegacyFixEnv(section map[string]any, id string, env map[string]string) error {
	name, ok := legacyFixEnv[id]
	if !ok {
		return nil
	}
	val, ok := env[name]
	if _, set := section["enabled"]; !ok || set {
		return nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(val))
	if err != nil {
		return fmt.Errorf("config: environment %s=%q is not true or false", name, val)
	}
	section["enabled"] = b
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
	if err := oneOf("logLevel", c.LogLevel, logging.Levels...); err != nil {
		return err
	}
	if err := oneOf("logFormat", c.LogFormat, logging.Formats...); err != nil {
		return err
	}
	if len(c.Families) == 0 {
		return fmt.Errorf("config: families: empty; at least one of ipv4, ipv6 is needed (remove the key for both)")
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
	if !filepath.IsAbs(c.ProcSysPath) {
		return fmt.Errorf("config: procSysPath: %q is not an absolute path", c.ProcSysPath)
	}
	if c.MetricsCertDir != "" && !c.MetricsSecure {
		return fmt.Errorf("config: metricsCertDir is set but metricsSecure is false: the certificate would not be used")
	}
	if c.MetricsSecure && c.MetricsAddress == "" {
		return fmt.Errorf("config: metricsSecure: metricsAddress is empty, there is no metrics listener to protect")
	}
	if c.MinSyncPeriod > c.SyncPeriod {
		return fmt.Errorf("config: minSyncPeriod: %s is longer than syncPeriod %s (changes would wait longer than a full resync)", c.MinSyncPeriod, c.SyncPeriod)
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

// ParsedPodCIDRs parses podCIDRs (rules.ParsePrefixes: a CIDR with host bits set is an error).
func (c *Config) ParsedPodCIDRs() ([]netip.Prefix, error) {
	p, err := rules.ParsePrefixes("podCIDRs", "", c.PodCIDRs)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return p, nil
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
	for _, k := range Keys {
		known[k.Env()] = true
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
