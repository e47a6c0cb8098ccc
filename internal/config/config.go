// Package config loads the agent's configuration with viper from a file, the environment (NNM_…) and
// flags, in rising order of precedence, and validates it strictly: an unknown key or a value that does
// not parse stops start-up with an error that names the key. The one exception is a file that declares
// a configVersion newer than Version: its unknown keys are taken for keys of a newer agent, logged and
// ignored (see Version).
package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
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
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/logging"
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
	// ServiceCIDRs are the cluster's Service (Cluster-IP) ranges, used when the API has no
	// ServiceCIDR objects (networking.k8s.io/v1).
	ServiceCIDRs []string `mapstructure:"serviceCIDRs"`
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
	// read-only, so components/conntrack-liberal mounts the node's /proc/sys/net at /host/proc/sys/net and sets this.
	ProcSysPath string `mapstructure:"procSysPath"`
	// MemoryLimit is the agent container's memory limit, a Kubernetes quantity (the DaemonSet sets
	// it from limits.memory through the downward API); empty means fix.MemoryLimit. The fixes' entry
	// budgets follow it (fix.BudgetFor).
	MemoryLimit string `mapstructure:"memoryLimit"`
	// LogLevel is debug, info, warn or error; a reload applies it.
	LogLevel string `mapstructure:"logLevel"`
	// LogFormat is text or json (internal/logging).
	LogFormat string `mapstructure:"logFormat"`
	// AcknowledgedChecks are diagnose checks whose problem the operator accepts on these nodes:
	// reported as acknowledged, not as a problem (no exit status 2, no alert, no True condition).
	AcknowledgedChecks []string `mapstructure:"acknowledgedChecks"`
	// Fixes holds one section per fix id: "enabled" plus the fix's own options.
	Fixes map[string]map[string]any `mapstructure:"fixes"`

	// File is the config file that was read ("" for none). Not a config key.
	File string `mapstructure:"-"`
	// KubeconfigPaths are the files of the standard KUBECONFIG variable (client-go's loading rules:
	// the kubeconfig key, then these, then the in-cluster config). Not a config key.
	KubeconfigPaths []string `mapstructure:"-"`
	// Warnings are problems that do not stop start-up (e.g. an NNM_ variable that is no config key:
	// the test harnesses set some of their own; a key of a newer configVersion), logged by the agent
	// at start and on a reload.
	Warnings []string `mapstructure:"-"`
	// FileVersion is the configVersion the file declares (Version when it declares none, or without
	// a file). Not a config key of its own: it is read from the file only.
	FileVersion int `mapstructure:"-"`

	// ignored are the options of a fix that ConfigureFix dropped as keys of a newer configVersion;
	// FixOptions leaves them out.
	ignored map[string][]string

	// origins say where every key that is set was set, for errors.
	origins origins

	// overrides are the file's nodeOverrides (of a base configuration); base and override are set
	// on a configuration ForNode made: the one it was made from, and the entry it applied.
	overrides []NodeOverride
	base      *Config
	override  Override
}

// Version is the newest configVersion this agent understands: the version of the configuration
// format, raised when a release adds a key. A file's top-level configVersion says which version it
// is written for (none means Version). Unknown keys in a file at or below Version are errors, so a
// typo still stops start-up with "did you mean"; in a file of a newer version they are keys this
// agent predates (an old pod restarted after the ConfigMap gained a key for a newer release), so
// each is logged as a warning and ignored while every key the agent knows is still validated.
// Keys from the environment and flags are always checked strictly: they belong to the agent's own
// manifest, written for this agent's version, so an unknown one there is a mistake.
const Version = 1

// VersionKey is the file's top-level key that declares its Version.
const VersionKey = "configVersion"

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
	{Key: "serviceCIDRs", Flag: "service-cidrs", Default: []string{}, Help: "the cluster's Service ranges, used when the API has no `ServiceCIDR` objects (networking.k8s.io/v1); DNAT fixes never take addresses in them over"},
	{Key: "minSyncPeriod", Flag: "min-sync-period", Default: time.Second, Help: "coalescing of changes; at most `syncPeriod`"},
	{Key: "syncPeriod", Flag: "sync-period", Default: 30 * time.Second, Help: "full resync that repairs drift"},
	{Key: "metricsAddress", Flag: "metrics-address", Default: "0.0.0.0:9484", Restart: true, Help: "`/metrics`, and the probes when `healthzAddress` is empty; empty: off"},
	{Key: "metricsSecure", Flag: "metrics-secure", Default: false, Restart: true,
		Help: "`/metrics` over HTTPS for bearer tokens the API server authenticates (TokenReview) and authorizes for get `/metrics` (SubjectAccessReview); `true` in deploy/base"},
	{Key: "metricsCertDir", Flag: "metrics-cert-dir", Default: "", Doc: "self-signed", Restart: true,
		Help: "directory with `tls.crt` and `tls.key` for the HTTPS metrics (re-read when they change)"},
	{Key: "healthzAddress", Flag: "healthz-address", Default: "", Doc: "on `metricsAddress`", Restart: true,
		Help: "`/livez`, `/readyz`, `/healthz` over plain HTTP (`127.0.0.1:9485` in deploy/base: the kubelet probes the node's loopback)"},
	{Key: "procSysPath", Flag: "proc-sys-path", Default: "/proc/sys", Restart: true,
		Help: "the sysctl tree the agent writes; a container's `/proc/sys` is read-only, so components/conntrack-liberal mounts the node's `/proc/sys/net` at `/host/proc/sys/net` and sets this"},
	{Key: "memoryLimit", Flag: "memory-limit", Default: "", Doc: "`128Mi`", Restart: true,
		Help: "the container's memory limit (the DaemonSet sets it from `limits.memory`); the fixes' entry budgets follow it"},
	{Key: "logLevel", Flag: "log-level", Default: "info", Help: "`debug`, `info`, `warn`, `error`"},
	{Key: "logFormat", Flag: "log-format", Default: "text", Restart: true, Help: "`text`, `json`; client-go's log lines use it too"},
	{Key: "acknowledgedChecks", Flag: "acknowledged-checks", Default: []string{},
		Help: "`diagnose` checks whose problem is accepted here (e.g. `rp-filter`): reported as acknowledged, with no exit status 2, alert or `True` Node condition"},
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
		MatchName:        func(key, field string) bool { return NormalizeKey(key) == NormalizeKey(field) },
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

// Legacy environment variables of the predecessor (Kakao network-node-manager) for the pod CIDRs,
// honoured so that users can migrate without editing their manifests. A fix's own legacy variable
// is its Spec.LegacyEnabledEnv (fix.Legacy), handed to Load.
const (
	LegacyPodCIDRv4 = "POD_CIDR_IPV4"
	LegacyPodCIDRv6 = "POD_CIDR_IPV6"
)

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
	AddKeyFlags(fs)
	fs.StringSlice("enable-fix", nil, "enable these fixes (ids), overriding file and environment")
	fs.StringSlice("disable-fix", nil, "disable these fixes (ids), overriding file and environment")
}

// AddKeyFlags registers --config, --set and the flags of the named keys (all keys when none are
// named), for a command that reads only some of them and refuses the rest (cleanup).
func AddKeyFlags(fs *pflag.FlagSet, only ...string) {
	fs.String("config", "", "configuration file (YAML)")
	for _, k := range Keys {
		if len(only) > 0 && !slices.Contains(only, k.Key) {
			continue
		}
		help := fmt.Sprintf("%s (env %s)", strings.ReplaceAll(k.Help, "`", ""), k.Env())
		switch d := k.Default.(type) {
		case string:
			fs.String(k.Flag, d, help)
		case []string:
			fs.StringSlice(k.Flag, d, help)
		case time.Duration:
			// Parsed by Load like the file and the environment, so a bad value gets the same error.
			fs.String(k.Flag, d.String(), help)
		case bool:
			fs.String(k.Flag, strconv.FormatBool(d), help)
			fs.Lookup(k.Flag).NoOptDefVal = "true"
		default:
			panic(fmt.Sprintf("config: key %s has a default of unsupported type %T", k.Key, d))
		}
	}
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
//
// legacy are the fixes' legacy variables (fix.IDs.Legacy): each sets fixes.<id>.enabled below
// NNM_FIXES_<ID>_ENABLED.
func Load(fs *pflag.FlagSet, environ []string, fixIDs []string, legacy ...fix.Legacy) (*Config, error) {
	v := viper.New()
	for _, k := range Keys {
		v.SetDefault(k.Key, k.Default)
	}
	o := newOrigins()

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
	version, overrides, overrideWarnings, err := mergeFile(v, file, fixIDs, &o)
	if err != nil {
		return nil, err
	}
	if err := mergeEnv(v, env, fixIDs, legacy, o); err != nil {
		return nil, err
	}
	if err := bindFlags(v, fs, o); err != nil {
		return nil, err
	}

	settings := v.AllSettings()
	ignored, err := checkKeys(v, settings, fixIDs, o, version)
	if err != nil {
		return nil, err
	}
	cfg := Config{}
	if err := decode(settings, &cfg); err != nil {
		return nil, o.decodeError(err)
	}
	cfg.File = file
	cfg.KubeconfigPaths = filepath.SplitList(env[KubeconfigEnv])
	cfg.Warnings = append(append(unknownEnv(env, fixIDs), ignored...), overrideWarnings...)
	cfg.overrides = overrides
	cfg.FileVersion = version
	cfg.Fixes = normalizeFixes(cfg.Fixes, fixIDs)
	cfg.origins = o
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.checkKubeconfig(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// mergeFile merges the config file (none: "") into v and returns its version and node overrides.
func mergeFile(v *viper.Viper, file string, fixIDs []string, o *origins) (version int, overrides []NodeOverride, overrideWarnings []string, err error) {
	version = Version
	if file == "" {
		return version, nil, nil, nil
	}
	// nodeOverrides is no viper key: viper would fold the case of the label keys in its
	// selectors, which Kubernetes compares exactly. readFile leaves it out of settings.
	settings, ovNode, err := readFile(file, o)
	if err != nil {
		return 0, nil, nil, err
	}
	if version, err = fileVersion(settings, *o); err != nil {
		return 0, nil, nil, err
	}
	if ovNode != nil {
		if overrides, overrideWarnings, err = parseNodeOverrides(ovNode, fixIDs, *o, version); err != nil {
			return 0, nil, nil, err
		}
	}
	canonicalFixKeys(settings)
	if err := v.MergeConfigMap(settings); err != nil {
		return 0, nil, nil, fmt.Errorf("config file %s: %w", file, err)
	}
	return version, overrides, overrideWarnings, nil
}

// mergeEnv merges the environment into v: every known key, and any NNM_FIXES_<ID>_<OPTION>
// variable (and the predecessor's variables the fixes and podCIDRs still take).
func mergeEnv(v *viper.Viper, env map[string]string, fixIDs []string, legacy []fix.Legacy, o origins) error {
	envLayer := map[string]any{}
	for _, k := range Keys {
		if val, ok := env[k.Env()]; ok {
			envLayer[k.Key] = val
			o.set(k.Key, k.Env())
		}
	}
	fixesLayer := map[string]any{}
	for _, id := range fixIDs {
		prefix := EnvName("fixes."+id) + "_"
		section := map[string]any{}
		for name, val := range env {
			if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
				opt := NormalizeKey(rest)
				section[opt] = val
				o.set("fixes."+id+"."+opt, name)
			}
		}
		if err := applyLegacyFixEnv(section, id, legacy, env, o); err != nil {
			return err
		}
		if len(section) > 0 {
			fixesLayer[id] = section
		}
	}
	if len(fixesLayer) > 0 {
		envLayer["fixes"] = fixesLayer
	}
	if err := applyLegacyPodCIDRs(envLayer, env, o); err != nil {
		return err
	}
	if err := v.MergeConfigMap(envLayer); err != nil {
		return fmt.Errorf("config: environment: %w", err)
	}

	return nil
}

// bindFlags binds the command line's flags (fs nil: none) to v's keys.
func bindFlags(v *viper.Viper, fs *pflag.FlagSet, o origins) error {
	if fs == nil {
		return nil
	}
	for _, k := range Keys {
		if f := fs.Lookup(k.Flag); f != nil {
			if err := v.BindPFlag(k.Key, f); err != nil {
				return fmt.Errorf("config: flag --%s: %w", k.Flag, err)
			}
			if f.Changed {
				o.set(k.Key, "--"+k.Flag)
			}
		}
	}
	if err := applyFixFlags(v, fs, o); err != nil {
		return err
	}
	return nil
}

// MaxFileSize bounds the config file: a ConfigMap, where the file comes from in a cluster, holds at
// most 1 MiB.
const MaxFileSize = 1 << 20

// readFile parses the config file into settings and records in o the line of every key path. Errors
// name the file and a line, never the content: the file may not be ours. A path that is not a
// regular file (a FIFO would block the read, a device never end) or is larger than MaxFileSize is
// refused before it is read.
func readFile(file string, o *origins) (settings map[string]any, overrides *yaml.Node, err error) {
	fi, err := os.Stat(file)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("config file %s: not a regular file (%s); accepted: a YAML file of at most 1 MiB", file, fileKind(fi.Mode()))
	}
	if fi.Size() > MaxFileSize {
		return nil, nil, fmt.Errorf("config file %s: %d bytes; accepted: a YAML file of at most 1 MiB (what a ConfigMap holds)", file, fi.Size())
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1)) // it may grow after the Stat
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, nil, fmt.Errorf("config file %s: more than 1 MiB; accepted: a YAML file of at most 1 MiB (what a ConfigMap holds)", file)
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
	// The nodeOverrides entries are read one at a time (parseNodeOverrides), not with the rest:
	// at 6,393 entries (the largest accepted file) their nodes, their decoded values and the line of
	// every key in them held at once were most of the agent's memory during a reload.
	rest := *root
	rest.Content = nil
	var ovKey *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if ovKey == nil && strings.EqualFold(root.Content[i].Value, NodeOverridesKey) {
			ovKey, overrides = root.Content[i], root.Content[i+1]
			continue
		}
		rest.Content = append(rest.Content, root.Content[i], root.Content[i+1])
	}
	root = &rest
	o.m = make(map[string]origin, len(o.m)+keyPaths(root)) // grown once, not doubling
	if ovKey != nil {
		o.m[strings.ToLower(ovKey.Value)] = origin{written: ovKey.Value, line: ovKey.Line}
	}
	if err := o.record(root.Content, "", "", 0); err != nil {
		return nil, nil, err
	}
	settings = map[string]any{}
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
	return settings, overrides, nil
}

// record records the line of every key path of the mapping pairs kv (a mapping node's Content),
// and of everything under them, prefixed by written and key. It builds each path's origins key
// (originKey's spelling) a segment at a time beside the path as written, so that no key costs more
// than its own two strings: at 6,393 nodeOverrides entries (the largest accepted file) a lower-cased
// copy of each whole path and a line number formatted into each was a tenth of the load's garbage.
// fixLevel is 1 when the keys are fix ids (the value of a fixes key at the top or in an entry of a
// list), 2 when they are a fix's options or below (NormalizeKey's spelling), else 0.
func (o origins) record(kv []*yaml.Node, written, key string, fixLevel int) error {
	for i := 0; i+1 < len(kv); i += 2 {
		seg := kv[i].Value
		kseg := strings.ToLower(seg)
		if fixLevel == 2 {
			kseg = NormalizeKey(seg)
		}
		w, k := written+seg, key+kseg
		line := kv[i].Line
		// Keys match without regard to case (viper), so syncPeriod and syncperiod are one key.
		if prev, dup := o.m[k]; dup {
			return fmt.Errorf("config: %s is set twice (lines %d and %d)", shownKey(w), prev.line, line)
		}
		o.m[k] = origin{written: w, line: line}
		next := 0
		switch {
		case fixLevel > 0:
			next = 2
		case kseg == "fixes" && (key == "" || strings.HasSuffix(key, "].")):
			next = 1
		}
		switch val := kv[i+1]; val.Kind {
		case yaml.MappingNode:
			if err := o.record(val.Content, w+".", k+".", next); err != nil {
				return err
			}
		case yaml.SequenceNode:
			// Entries of a list are named written[i].
			for j, item := range val.Content {
				index := "[" + strconv.Itoa(j) + "]"
				o.m[k+index] = origin{written: w + index, line: item.Line}
				if item.Kind == yaml.MappingNode {
					if err := o.record(item.Content, w+index+".", k+index+".", next&2); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// keyPaths counts the key paths record records under n: a key of a mapping, an item of a list.
func keyPaths(n *yaml.Node) int {
	count := 0
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			count += 1 + keyPaths(n.Content[i+1])
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			count++
			if item.Kind == yaml.MappingNode {
				count += keyPaths(item)
			}
		}
	}
	return count
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "not a regular file"
}

var (
	yamlLine = regexp.MustCompile(`line (\d+)`)
	// keyName is what a configuration key can look like; other "keys" (a line of a credentials
	// file that YAML read as a key) are not repeated in errors.
	keyName = regexp.MustCompile(`^[A-Za-z0-9_.\[\]/-]{1,96}$`)
)

// shownKey returns the key for an error message, or a placeholder when it does not look like one.
func shownKey(key string) string {
	if keyName.MatchString(key) {
		return key
	}
	return "(a key that is no configuration key name, not shown)"
}

// origin is where a key was set last: its spelling there and the place: a line of the config file,
// else where ("NNM_SYNC_PERIOD", "--sync-period", "--set").
type origin struct {
	written, where string
	line           int
}

// place is "line 3", or where.
func (x origin) place() string {
	if x.line > 0 {
		return "line " + strconv.Itoa(x.line)
	}
	return x.where
}

// origins map each dotted key path, in originKey's spelling, to its origin; the layers record in
// rising precedence, so the entry is the layer whose value counts. A configuration for a node
// (ForNode) records only what its override changes, over the loaded file's origins (under).
type origins struct {
	m     map[string]origin
	under *origins
}

func newOrigins() origins { return origins{m: map[string]origin{}} }

func (o origins) set(written, where string) {
	o.m[originKey(written)] = origin{written: written, where: where}
}

// lookup is the origin of key (in originKey's spelling), from this layer or those under it.
func (o origins) lookup(key string) (origin, bool) {
	for l := &o; l != nil; l = l.under {
		if x, ok := l.m[key]; ok {
			return x, true
		}
	}
	return origin{}, false
}

// originKey is the spelling under which origins keeps a key path: lower case (viper's), and the
// option of a fix (fixes.<id>.<option>, also inside nodeOverrides) in NormalizeKey's spelling, as
// fix options compare.
func originKey(path string) string {
	p := strings.ToLower(path)
	for i := 0; ; {
		j := strings.Index(p[i:], "fixes.")
		if j < 0 {
			return p
		}
		j += i
		if j == 0 || strings.HasSuffix(p[:j], "].") {
			if id, opt, ok := strings.Cut(p[j+len("fixes."):], "."); ok {
				return p[:j] + "fixes." + id + "." + NormalizeKey(opt)
			}
			return p
		}
		i = j + 1
	}
}

// canonicalFixKeys renames the options of every fixes.<id> section in settings (a layer before it is
// merged) to NormalizeKey's spelling, so that podInterfacePrefix in the file and
// NNM_FIXES_…_POD_INTERFACE_PREFIX are one key, the environment's winning.
func canonicalFixKeys(settings map[string]any) {
	for name, fixes := range settings {
		if !strings.EqualFold(name, "fixes") {
			continue
		}
		sections, _ := fixes.(map[string]any)
		for _, section := range sections {
			opts, _ := section.(map[string]any)
			for _, k := range slices.Collect(maps.Keys(opts)) {
				if n := NormalizeKey(k); n != k {
					opts[n] = opts[k]
					delete(opts, k)
				}
			}
		}
	}
}

// at returns the key as written and where it was set ("" when nowhere: a default).
func (o origins) at(key string) (string, string) {
	if x, ok := o.lookup(originKey(key)); ok {
		return x.written, x.place()
	}
	return key, ""
}

// fileVersion takes VersionKey out of the file's settings (it is no viper key) and returns it:
// Version when the file has none, else a whole number of at least 1.
func fileVersion(settings map[string]any, o origins) (int, error) {
	for name, val := range settings {
		if !strings.EqualFold(name, VersionKey) {
			continue
		}
		delete(settings, name)
		n, ok := val.(int)
		if !ok || n < 1 {
			return 0, o.errorf(VersionKey, "%s is not a configuration version; accepted: a whole number from 1 (this agent reads up to %d)", fix.ShowValue(val), Version)
		}
		return n, nil
	}
	return Version, nil
}

// newerKey is the warning for a key of a file whose configVersion is newer than Version.
func (o origins) newerKey(key string, version int) string {
	return fmt.Sprintf("%s: unknown to this agent, which reads configVersion up to %d; the file declares configVersion %d, so it is taken for a key of a newer version and ignored", o.place(key), Version, version)
}

// fromFile reports whether the value of key that counts was set in the config file.
func (o origins) fromFile(key string) bool {
	_, where := o.at(key)
	return strings.HasPrefix(where, "line ")
}

// place is the key as written and where it was set: "fixes.invalid-drop.hook (line 3)".
func (o origins) place(key string) string {
	written, where := o.at(key)
	if where != "" {
		where = " (" + where + ")"
	}
	return shownKey(written) + where
}

// KeyError is the one shape of a configuration error about one key, from every source: the key as
// the user wrote it, where (file line, environment variable or flag), then the problem, which shows
// the value and what is accepted:
//
//	config: fixes.invalid-drop.hook (line 3): unknown key; did you mean hooks?
//
// Callers tell its parts with errors.As rather than by reading the text.
type KeyError struct {
	// Path is the key as written: syncPeriod, fixes.invalid-drop.hook, nodeOverrides[0].nodeSelector.
	Path string
	// Key is the last part of Path (hook).
	Key string
	// Where is where it was set: "line 3", "NNM_SYNC_PERIOD", "--sync-period", "--set"; "" for a
	// default.
	Where string
	// Problem shows the value and what is accepted.
	Problem string
	// Suggestion is the known key nearest to an unknown one (a likely typo), else "".
	Suggestion string
	// Err is the error it was made from (a fix's *fix.OptionError), if any.
	Err error
}

func (e *KeyError) Error() string {
	where := ""
	if e.Where != "" {
		where = " (" + e.Where + ")"
	}
	return "config: " + shownKey(e.Path) + where + ": " + e.Problem
}

func (e *KeyError) Unwrap() error { return e.Err }

// keyError is the KeyError of key (any spelling) as written and where it was set.
func (o origins) keyError(key, problem string) *KeyError {
	written, where := o.at(key)
	last := written
	if i := strings.LastIndexAny(written, ".]"); i >= 0 {
		last = written[i+1:]
	}
	return &KeyError{Path: written, Key: last, Where: where, Problem: problem}
}

// errorf is a KeyError on key with a formatted problem.
func (o origins) errorf(key, format string, args ...any) error {
	return o.keyError(key, fmt.Sprintf(format, args...))
}

// unknown is the KeyError of a key that is not one of known (noun: "key", "fix").
func (o origins) unknown(key, noun, name string, known []string) error {
	e := o.keyError(key, fix.UnknownKey(noun, name, known))
	e.Suggestion = fix.Nearest(name, known)
	return e
}

// decodeError words what the decoder still finds after checkKeys (it checked every top-level
// value's kind, so this is unexpected) in the same shape.
func (o origins) decodeError(err error) error {
	var errs []error
	for _, e := range fix.ErrorLeaves(fix.DecodeError(err)) {
		var oe *fix.OptionError
		if errors.As(e, &oe) {
			ke := o.keyError(oe.Key, oe.Problem)
			ke.Err = oe
			errs = append(errs, ke)
		} else {
			errs = append(errs, fmt.Errorf("config: %w", e))
		}
	}
	return errors.Join(errs...)
}

// FixError puts an error of a fix's Configure into the configuration's error shape, naming where
// the option was set: each fix.OptionError (fix.Decode's, and a fix's Parse's fix.Invalid) becomes a
// KeyError on fixes.<id>.<option> that wraps it; any other error is the fix's section's.
func (c *Config) FixError(id string, err error) error {
	prefix := "fixes." + id
	var errs []error
	for _, e := range fix.ErrorLeaves(err) {
		var oe *fix.OptionError
		if errors.As(e, &oe) {
			key := prefix
			if oe.Key != "" {
				key += "." + oe.Key
			}
			ke := c.origins.keyError(key, oe.Problem)
			ke.Suggestion, ke.Err = oe.Suggestion, oe
			errs = append(errs, ke)
			continue
		}
		ke := c.origins.keyError(prefix, strings.TrimPrefix(e.Error(), prefix+": "))
		ke.Err = e
		errs = append(errs, ke)
	}
	return errors.Join(errs...)
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

func applyFixFlags(v *viper.Viper, fs *pflag.FlagSet, o origins) error {
	named := map[string]string{}
	for _, flag := range []string{"enable-fix", "disable-fix"} {
		if f := fs.Lookup(flag); f != nil && f.Changed {
			for _, id := range f.Value.(pflag.SliceValue).GetSlice() {
				if other, ok := named[id]; ok && other != flag {
					return fmt.Errorf("config: fix %q is named by both --enable-fix and --disable-fix", id)
				}
				named[id] = flag
				v.Set("fixes."+id+".enabled", flag == "enable-fix")
				o.set("fixes."+id, "--"+flag)
				o.set("fixes."+id+".enabled", "--"+flag)
			}
		}
	}
	if f := fs.Lookup("set"); f != nil && f.Changed {
		for _, kv := range f.Value.(pflag.SliceValue).GetSlice() {
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return fmt.Errorf("config: --set %q: want key=value", kv)
			}
			k = strings.TrimSpace(k)
			if rest, ok := strings.CutPrefix(k, "fixes."); ok {
				if id, opt, ok := strings.Cut(rest, "."); ok {
					k = "fixes." + id + "." + NormalizeKey(opt)
				}
			}
			v.Set(k, val)
			o.set(k, "--set")
		}
	}
	return nil
}

// checkKeys rejects keys that are not configuration keys and values of the wrong kind (a list for a
// single value, a word for a duration, a fix's section that is not a mapping), before decoding, so
// that the errors show the value and what is accepted rather than what the decoder says. When the
// file's version is newer than Version, an unknown key or fix id whose value comes from the file is
// removed from settings instead and returned as a warning.
func checkKeys(v *viper.Viper, settings map[string]any, fixIDs []string, o origins, version int) ([]string, error) {
	newer := func(key string) bool { return version > Version && o.fromFile(key) }
	var warnings []string
	names := []string{"fixes"}
	known := map[string]Key{}
	for _, k := range Keys {
		names = append(names, k.Key)
		known[strings.ToLower(k.Key)] = k
	}
	var errs []error
	unknown := map[string]bool{} // top-level keys of a newer version, removed from settings
	for _, key := range v.AllKeys() {
		top, _, _ := strings.Cut(key, ".")
		switch {
		case top == "fixes" || known[top].Key != "":
		case top == strings.ToLower(VersionKey):
			errs = append(errs, o.errorf(key, "set only in the config file, where it says which configuration version the file is written for"))
		case top == strings.ToLower(NodeOverridesKey):
			errs = append(errs, o.errorf(key, "set only in the config file (a list of {nodeSelector, fixes} entries)"))
		case newer(key):
			warnings = append(warnings, o.newerKey(key, version))
			unknown[top] = true
		default:
			written, _ := o.at(key)
			errs = append(errs, o.unknown(key, "key", written, names))
		}
	}
	for top := range unknown {
		delete(settings, top)
	}
	for _, k := range Keys {
		val, ok := settings[strings.ToLower(k.Key)]
		if !ok {
			continue
		}
		if p := fix.ValueProblem(val, reflect.TypeOf(k.Default)); p != "" {
			errs = append(errs, o.errorf(k.Key, "%s", p))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	fixes, ok := settings["fixes"]
	if !ok || fixes == nil {
		return warnings, nil
	}
	sections, ok := fixes.(map[string]any)
	if !ok {
		return nil, o.errorf("fixes", "%s is not a mapping of fix ids such as {invalid-drop: {enabled: true}}", fix.ShowValue(fixes))
	}
	for _, id := range slices.Sorted(maps.Keys(sections)) {
		key := "fixes." + id
		if !slices.Contains(fixIDs, id) {
			if newer(key) && allFromFile(sections[id], key, o) {
				warnings = append(warnings, o.newerKey(key, version))
				delete(sections, id)
				continue
			}
			errs = append(errs, o.unknown(key, "fix", id, fixIDs))
			continue
		}
		if section := sections[id]; section != nil {
			if _, ok := section.(map[string]any); !ok {
				errs = append(errs, o.errorf(key, "%s is not a mapping such as {enabled: true}", fix.ShowValue(section)))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return warnings, nil
}

// allFromFile reports whether key and every key under val were set in the config file (an unknown
// fix's section may have been extended by --set or --enable-fix, which are checked strictly).
func allFromFile(val any, key string, o origins) bool {
	if !o.fromFile(key) {
		return false
	}
	m, _ := val.(map[string]any)
	for k, sub := range m {
		if !allFromFile(sub, key+"."+k, o) {
			return false
		}
	}
	return true
}

// applyLegacyPodCIDRs sets podCIDRs from POD_CIDR_IPV4 / POD_CIDR_IPV6 unless NNM_POD_CIDRS is set.
// Each variable takes only its family's CIDRs.
func applyLegacyPodCIDRs(envLayer map[string]any, env map[string]string, o origins) error {
	if _, ok := env[EnvName("podCIDRs")]; ok {
		return nil
	}
	var cidrs, from []string
	for _, name := range []string{LegacyPodCIDRv4, LegacyPodCIDRv6} {
		fam := map[string]rules.Family{LegacyPodCIDRv4: rules.IPv4, LegacyPodCIDRv6: rules.IPv6}[name]
		list := splitList(env[name])
		if _, err := rules.ParsePrefixes(name, fam, list); err != nil {
			return fmt.Errorf("config: environment %w", err)
		}
		if len(list) > 0 {
			from = append(from, name)
		}
		cidrs = append(cidrs, list...)
	}
	if len(cidrs) > 0 {
		sort.Strings(cidrs) // IPv4 before IPv6
		envLayer["podCIDRs"] = cidrs
		o.set("podCIDRs", strings.Join(from, ", "))
	}
	return nil
}

// applyLegacyFixEnv sets fixes.<id>.enabled from the predecessor's variable unless the section
// already has it from NNM_FIXES_<ID>_ENABLED.
func applyLegacyFixEnv(section map[string]any, id string, legacy []fix.Legacy, env map[string]string, o origins) error {
	i := slices.IndexFunc(legacy, func(l fix.Legacy) bool { return l.Fix == id })
	if i < 0 {
		return nil
	}
	name := legacy[i].Env
	val, ok := env[name]
	if _, set := section["enabled"]; !ok || set {
		return nil
	}
	b, err := strconv.ParseBool(strings.TrimSpace(val))
	if err != nil {
		return fmt.Errorf("config: environment %s=%q is not true or false", name, val)
	}
	section["enabled"] = b
	o.set("fixes."+id+".enabled", name)
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

// Validate checks values that decoding alone does not. Errors name the key as written and where it
// was set (Load records it; a Config built otherwise says "default").
func (c *Config) Validate() error {
	o := c.origins
	oneOf := func(key, val string, allowed ...string) error {
		if !slices.Contains(allowed, val) {
			return o.errorf(key, "%s is not one of %s", fix.ShowValue(val), strings.Join(allowed, ", "))
		}
		return nil
	}
	if err := oneOf("backend", c.Backend, append([]string{"auto"}, backend.Names...)...); err != nil {
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
		return o.errorf("families", "empty; accepted: ipv4, ipv6 or both (remove the key for both)")
	}
	for _, f := range c.Families {
		if _, err := rules.ParseFamily(f); err != nil {
			return o.errorf("families", "%s is not one of ipv4, ipv6", fix.ShowValue(f))
		}
	}
	if _, err := c.ParsedPodCIDRs(); err != nil {
		return err
	}
	if _, err := c.ParsedServiceCIDRs(); err != nil {
		return err
	}
	if c.MinSyncPeriod < 0 {
		return o.errorf("minSyncPeriod", "%s is negative; accepted: 0s or more, at most syncPeriod", c.MinSyncPeriod)
	}
	if c.SyncPeriod <= 0 {
		return o.errorf("syncPeriod", "%s; accepted: a positive duration such as 30s", c.SyncPeriod)
	}
	if !filepath.IsAbs(c.ProcSysPath) {
		return o.errorf("procSysPath", "%s is not an absolute path", fix.ShowValue(c.ProcSysPath))
	}
	if _, err := c.ParsedMemoryLimit(); err != nil {
		return err
	}
	if c.MetricsCertDir != "" && !c.MetricsSecure {
		return o.errorf("metricsCertDir", "set, but metricsSecure is false: the certificate would not be used")
	}
	if c.MetricsSecure && c.MetricsAddress == "" {
		return o.errorf("metricsSecure", "true, but metricsAddress is empty: there is no metrics listener to protect")
	}
	if c.MinSyncPeriod > c.SyncPeriod {
		_, where := o.at("syncPeriod")
		if where != "" {
			where = " (" + where + ")"
		}
		return o.errorf("minSyncPeriod", "%s is longer than syncPeriod %s%s; accepted: at most syncPeriod (changes would wait longer than a full resync)", c.MinSyncPeriod, c.SyncPeriod, where)
	}
	for _, id := range slices.Sorted(maps.Keys(c.Fixes)) {
		if val, ok := c.Fixes[id]["enabled"]; ok {
			if _, err := parseBool(val); err != nil {
				return o.errorf("fixes."+id+".enabled", "%s is not true or false", fix.ShowValue(val))
			}
		}
	}
	return nil
}

// checkKubeconfig refuses a kubeconfig key naming a file that is not there, as client-go's loading
// rules do for an explicit path (kubectl --kubeconfig); without the check the agent would start,
// log that it cannot build a client and run without the API. The files of KUBECONFIG may be
// missing, as client-go allows.
func (c *Config) checkKubeconfig() error {
	if c.Kubeconfig == "" {
		return nil
	}
	fi, err := os.Stat(c.Kubeconfig)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return c.origins.errorf("kubeconfig", "%s: no such file; accepted: a kubeconfig file, or no value for the files in KUBECONFIG, else the in-cluster config", fix.ShowValue(c.Kubeconfig))
	case err != nil:
		return c.origins.errorf("kubeconfig", "%s: %v", fix.ShowValue(c.Kubeconfig), errors.Unwrap(err))
	case !fi.Mode().IsRegular():
		return c.origins.errorf("kubeconfig", "%s is %s; accepted: a kubeconfig file", fix.ShowValue(c.Kubeconfig), fileKind(fi.Mode()))
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
		var oe *fix.OptionError
		errors.As(fix.OptionErr("podCIDRs", err), &oe)
		return nil, c.origins.errorf("podCIDRs", "%s", oe.Problem)
	}
	return p, nil
}

// ParsedServiceCIDRs parses serviceCIDRs (rules.ParsePrefixes: a CIDR with host bits set is an
// error).
func (c *Config) ParsedServiceCIDRs() ([]netip.Prefix, error) {
	p, err := rules.ParsePrefixes("serviceCIDRs", "", c.ServiceCIDRs)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return p, nil
}

// ParsedMemoryLimit is MemoryLimit in bytes; 0 when it is empty (fix.MemoryLimit applies).
func (c *Config) ParsedMemoryLimit() (int64, error) {
	if c.MemoryLimit == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(c.MemoryLimit)
	if err != nil {
		return 0, c.origins.errorf("memoryLimit", "%s is not a quantity such as 128Mi or 134217728 (bytes)", fix.ShowValue(c.MemoryLimit))
	}
	if q.Sign() <= 0 {
		return 0, c.origins.errorf("memoryLimit", "%s is not positive", fix.ShowValue(c.MemoryLimit))
	}
	return q.Value(), nil
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

// FixOptions returns the options of a fix without "enabled" and without the options ConfigureFix
// ignored.
func (c *Config) FixOptions(id string) map[string]any {
	out := map[string]any{}
	for k, val := range c.Fixes[id] {
		if !strings.EqualFold(k, "enabled") && !slices.Contains(c.ignored[id], k) {
			out[k] = val
		}
	}
	return out
}

// ConfigureFix hands the fix's options to configure (the fix's Configure) and returns its error in
// the configuration's shape (FixError). For a file of a newer configVersion (see Version), options
// the fix does not know that the file set are keys of a newer agent: configure is called again
// without them, they are returned as warnings, and FixOptions leaves them out from then on.
func (c *Config) ConfigureFix(id string, configure func(map[string]any) error) ([]string, error) {
	err := configure(c.FixOptions(id))
	if err == nil || c.FileVersion <= Version {
		return nil, c.fixError(id, err)
	}
	var drop, warnings []string
	for _, e := range fix.ErrorLeaves(err) {
		var oe *fix.OptionError
		if errors.As(e, &oe) && oe.Unknown && c.origins.fromFile("fixes."+id+"."+oe.Key) {
			drop = append(drop, oe.Key)
			warnings = append(warnings, c.origins.newerKey("fixes."+id+"."+oe.Key, c.FileVersion))
		}
	}
	if len(drop) == 0 {
		return nil, c.FixError(id, err)
	}
	if c.ignored == nil {
		c.ignored = map[string][]string{}
	}
	c.ignored[id] = append(c.ignored[id], drop...)
	if err := configure(c.FixOptions(id)); err != nil {
		return nil, c.FixError(id, err)
	}
	return warnings, nil
}

func (c *Config) fixError(id string, err error) error {
	if err == nil {
		return nil
	}
	return c.FixError(id, err)
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
			msg := fmt.Sprintf("environment variable %s is not a configuration key; ignored", name)
			if near := fix.Nearest(name, slices.Sorted(maps.Keys(known))); near != "" {
				msg += "; did you mean " + near + "?"
			}
			out = append(out, msg)
		}
	}
	sort.Strings(out)
	return out
}
