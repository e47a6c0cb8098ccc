// Package detect finds out what the agent needs to know about its node: kube-proxy's mode, which rule
// backend to use and which iptables variant. Every value can be set in the configuration; "auto"
// asks the probes. The result says how each value was found, for logs and the nnm_agent_info metric.
//
// Every signal goes through Probes, so each one can be faked in tests; RealProbes reads the node
// (read-only: an HTTP GET on 127.0.0.1, a link lookup, a table listing over netlink, `iptables-*-save`, and
// optionally one ConfigMap GET).
package detect

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// Proxy-mode sources, in the order they are tried.
const (
	SourceConfig          = "config"
	SourceMetricsEndpoint = "metrics-endpoint"
	SourceIPVSLink        = "kube-ipvs0-link"
	SourceNFTablesTable   = "nftables-table"
	SourceConfigMap       = "configmap"
	SourceUnknown         = "unknown"
)

// Backend and iptables-variant sources.
const (
	SourceProxyMode  = "proxy-mode"   // backend follows the kube-proxy mode
	SourceDefault    = "default"      // nothing pointed either way
	SourceHintChain  = "kubelet-hint" // KUBE-IPTABLES-HINT / KUBE-KUBELET-CANARY in the mangle table
	SourceRuleCount  = "rule-count"   // the variant holding more rules
	SourceNoBackends = "unavailable"  // only one variant's tools work
)

// ProxyModes are the kube-proxy modes the agent knows.
var ProxyModes = []string{"ipvs", "iptables", "nftables"}

// Result is what the agent runs with.
type Result struct {
	ProxyMode             string
	ProxyModeSource       string
	Backend               string
	BackendSource         string
	IptablesVariant       string
	IptablesVariantSource string
	// Features is what the kernel and the image offer; nil when not probed.
	Features *Features
	// Notes are what the probes saw on the way (failed probes, counts), for the log.
	Notes []string
}

// Features says which kernel features and tools work on the node. A missing one does not stop the
// agent: the fix that needs it fails with an error naming it, the other fixes keep working.
type Features struct {
	// NFTables: nft is installed and the tables can be listed (kernel has nf_tables, CAP_NET_ADMIN).
	NFTables    bool
	NFTablesErr string
	// ConntrackMatch: the selected iptables variant knows the conntrack match (-m conntrack).
	ConntrackMatch    bool
	ConntrackMatchErr string
	// IptablesVersion is the selected variant's version ("1.8.9"), "" when its binary does not run
	// (IptablesErr says why). RandomFully: it has MASQUERADE --random-fully (1.6.2+).
	IptablesVersion string
	IptablesErr     string
	RandomFully     bool
}

// IptablesTool is what detection reads from an iptables binary; go-iptables' *IPTables is one.
type IptablesTool interface {
	GetIptablesVersion() (int, int, int)
	HasRandomFully() bool
}

// Probes are the signals detection reads. A nil func means "signal not available" and is skipped.
type Probes struct {
	// ProxyModeEndpoint returns the body of kube-proxy's http://127.0.0.1:10249/proxyMode.
	ProxyModeEndpoint func(ctx context.Context) (string, error)
	// LinkExists reports whether a network interface of that name exists (kube-ipvs0).
	LinkExists func(name string) (bool, error)
	// NFTTables lists nftables tables as "family name" pairs, e.g. "ip kube-proxy".
	NFTTables func(ctx context.Context) ([]string, error)
	// KubeProxyConfigMap returns data["config.conf"] of kube-system/kube-proxy; found is false when
	// the ConfigMap or the key does not exist. Nil when the agent has no API client (plan).
	KubeProxyConfigMap func(ctx context.Context) (conf string, found bool, err error)
	// IptablesSave returns the output of <iptables|ip6tables>-<variant>-save [-t table] for variant
	// "nft" or "legacy", family "ipv4" or "ipv6", table "" for all tables.
	IptablesSave func(ctx context.Context, variant, family, table string) (string, error)
	// ConntrackMatch checks that the variant's iptables knows -m conntrack.
	ConntrackMatch func(ctx context.Context, variant string) error
	// Iptables returns the variant's iptables binary for the family (go-iptables in RealProbes).
	Iptables func(variant, family string) (IptablesTool, error)
}

// Resolve turns "auto" settings into concrete values using p. Without any probe (Probes{}), an
// unknown kube-proxy mode stays "" (so mode-specific fixes keep their conservative defaults), the
// backend is iptables and the iptables variant is nft. log may be nil.
func Resolve(ctx context.Context, cfg *config.Config, p Probes, log *slog.Logger) Result {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if p.NFTTables != nil {
		p.NFTTables = once(p.NFTTables)
	}
	r := Result{
		ProxyMode: cfg.ProxyMode, ProxyModeSource: SourceConfig,
		Backend: cfg.Backend, BackendSource: SourceConfig,
		IptablesVariant: cfg.IptablesVariant, IptablesVariantSource: SourceConfig,
	}
	if r.ProxyMode == "auto" {
		pm := ProxyMode(ctx, p)
		r.ProxyMode, r.ProxyModeSource = pm.Mode, pm.Source
		r.Notes = append(r.Notes, pm.Evidence...)
	}
	if r.Backend == "auto" {
		r.Backend, r.BackendSource = BackendFor(r.ProxyMode)
	}
	if r.IptablesVariant == "auto" {
		r.IptablesVariant, r.IptablesVariantSource = iptablesVariant(ctx, p, &r)
	}
	r.Features = features(ctx, p, r)
	for _, n := range r.Notes {
		log.Debug("detection", "note", n)
	}
	return r
}

// BackendFor is the backend that `backend: auto` chooses for a kube-proxy mode, and its source:
// nftables beside nftables mode, iptables otherwise (following the mode, or by default when the mode
// is unknown or there is no kube-proxy).
func BackendFor(mode string) (name, source string) {
	switch mode {
	case "nftables":
		return backend.NFTables, SourceProxyMode
	case "ipvs", "iptables":
		return backend.IPTables, SourceProxyMode
	}
	return backend.IPTables, SourceDefault
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// ModeNone is the proxy mode of a node where no kube-proxy runs (a CNI replaces it, e.g. Cilium's
// kube-proxy replacement): no /proxyMode answer, no kube-ipvs0 link, no kube-proxy nftables table and
// no KUBE-SERVICES chain in either iptables variant.
const ModeNone = fix.ProxyModeNone

// SourceNoKubeProxy is the source of ModeNone: every probe answered, none saw kube-proxy.
const SourceNoKubeProxy = "no-kube-proxy"

// SourceKubeServicesChain: kube-proxy's KUBE-SERVICES chain in the nat table, without kube-ipvs0
// (IPVS mode has both), i.e. iptables mode.
const SourceKubeServicesChain = "kube-services-chain"

// ProxyModeResult is what ProxyMode found: the mode ("ipvs", "iptables", "nftables", ModeNone, or ""
// when it cannot tell), the signal it came from, what each probe saw (Evidence, in the order tried)
// and, when Mode is "", why not (Unknown).
type ProxyModeResult struct {
	Mode     string
	Source   string
	Evidence []string
	Unknown  string
}

// ProxyMode finds kube-proxy's mode from the node's signals, in order: kube-proxy's own /proxyMode
// answer; the kube-ipvs0 link that only IPVS mode creates; the ip/ip6 kube-proxy nftables table that
// only nftables mode creates; kube-proxy's KUBE-SERVICES chain in the nat table (iptables mode; IPVS
// mode has one too, but also kube-ipvs0, checked before). When every probe answered and none saw
// kube-proxy, the node has none (ModeNone), whatever a kube-proxy ConfigMap left in the cluster says:
// it is reported as evidence only. The ConfigMap decides only when a probe failed, so that kube-proxy
// cannot be ruled out. Read-only; a nil probe counts as failed. The agent calls it at start and on
// every resync (Follower), `diagnose` may call it as it is.
func ProxyMode(ctx context.Context, p Probes) ProxyModeResult {
	d := &detection{p: p}
	for _, probe := range []func(context.Context) bool{d.metricsEndpoint, d.ipvsLink, d.nftablesTable, d.kubeServicesChain} {
		if probe(ctx) {
			return d.r
		}
	}
	cmMode := d.configMapMode(ctx)
	switch {
	case !d.failed:
		if cmMode != "" {
			d.see("kube-proxy ConfigMap: mode %s, but nothing of kube-proxy on this node: a leftover, ignored", cmMode)
		}
		d.r.Mode, d.r.Source = ModeNone, SourceNoKubeProxy
	case cmMode != "":
		d.see("kube-proxy ConfigMap: mode %s (a probe failed, so kube-proxy could not be ruled out)", cmMode)
		d.r.Mode, d.r.Source = cmMode, SourceConfigMap
	default:
		d.r.Source = SourceUnknown
		d.r.Unknown = "no probe saw kube-proxy and at least one could not look: " + strings.Join(d.r.Evidence, "; ")
	}
	return d.r
}

// detection is one ProxyMode run: each probe records what it saw in r.Evidence and returns true
// when it found kube-proxy (r then holds the mode and its source); failed is set when a probe could
// not look, so kube-proxy cannot be ruled out.
type detection struct {
	p      Probes
	r      ProxyModeResult
	failed bool
}

func (d *detection) see(format string, args ...any) {
	d.r.Evidence = append(d.r.Evidence, fmt.Sprintf(format, args...))
}

func (d *detection) found(mode, source string) bool {
	d.r.Mode, d.r.Source = mode, source
	return true
}

// metricsEndpoint asks kube-proxy's /proxyMode.
func (d *detection) metricsEndpoint(ctx context.Context) bool {
	if d.p.ProxyModeEndpoint == nil {
		d.failed = true
		return false
	}
	body, err := d.p.ProxyModeEndpoint(ctx)
	mode := strings.TrimSpace(body)
	switch {
	case err != nil:
		d.see("metrics endpoint: no answer: %v", err)
	case knownMode(mode):
		d.see("metrics endpoint: %s", mode)
		return d.found(mode, SourceMetricsEndpoint)
	default:
		// Something answers there, but not with a mode we know.
		d.see("metrics endpoint: unexpected answer %q", mode)
		d.failed = true
	}
	return false
}

// ipvsLink looks for IPVS mode's dummy interface.
func (d *detection) ipvsLink(context.Context) bool {
	if d.p.LinkExists == nil {
		d.failed = true
		return false
	}
	ok, err := d.p.LinkExists("kube-ipvs0")
	switch {
	case err != nil:
		d.see("kube-ipvs0 link: %v", err)
		d.failed = true
	case ok:
		d.see("kube-ipvs0 link: present")
		return d.found("ipvs", SourceIPVSLink)
	default:
		d.see("kube-ipvs0 link: absent")
	}
	return false
}

// nftablesTable looks for nftables mode's tables.
func (d *detection) nftablesTable(ctx context.Context) bool {
	if d.p.NFTTables == nil {
		d.failed = true
		return false
	}
	tables, err := d.p.NFTTables(ctx)
	if err != nil {
		d.see("nftables tables: %v", err)
		d.failed = true
	}
	for _, t := range tables {
		if f := strings.Fields(t); len(f) == 2 && (f[0] == "ip" || f[0] == "ip6") && f[1] == "kube-proxy" {
			d.see("nftables table %s: present", t)
			return d.found("nftables", SourceNFTablesTable)
		}
	}
	if err == nil {
		d.see("nftables table ip/ip6 kube-proxy: absent")
	}
	return false
}

// kubeServicesChain looks for iptables mode's KUBE-SERVICES chain in both variants and families.
func (d *detection) kubeServicesChain(ctx context.Context) bool {
	if d.p.IptablesSave == nil {
		d.failed = true
		return false
	}
	for _, v := range []string{"nft", "legacy"} {
		for _, fam := range []string{"ipv4", "ipv6"} {
			out, err := d.p.IptablesSave(ctx, v, fam, "nat")
			if err != nil {
				d.see("%s %s nat table: %v", v, fam, err)
				d.failed = true
				continue
			}
			if hasChain(out, "KUBE-SERVICES") {
				d.see("%s %s nat table: chain KUBE-SERVICES present", v, fam)
				return d.found("iptables", SourceKubeServicesChain)
			}
		}
	}
	d.see("iptables nat tables: no KUBE-SERVICES chain")
	return false
}

// configMapMode is the mode kube-proxy's ConfigMap names, "" when it names none.
func (d *detection) configMapMode(ctx context.Context) string {
	if d.p.KubeProxyConfigMap == nil {
		return ""
	}
	conf, found, err := d.p.KubeProxyConfigMap(ctx)
	switch {
	case err != nil:
		d.see("kube-proxy ConfigMap: %v", err)
	case !found:
		d.see("kube-proxy ConfigMap: not found")
	default:
		mode, err := ModeFromKubeProxyConfig(conf)
		if err != nil {
			d.see("kube-proxy ConfigMap: %v", err)
			return ""
		}
		return mode
	}
	return ""
}

// hasChain reports whether an iptables-save dump declares chain.
func hasChain(dump, chain string) bool {
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), ":"+chain+" ") {
			return true
		}
	}
	return false
}

func knownMode(m string) bool {
	for _, k := range ProxyModes {
		if m == k {
			return true
		}
	}
	return false
}

// iptablesVariant decides legacy or nft like kubernetes-sigs/iptables-wrappers: kubelet (1.17+)
// creates KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY in the mangle table of the variant the node uses,
// nft checked first; without those, the variant holding more rules wins; a tie means nft.
func iptablesVariant(ctx context.Context, p Probes, r *Result) (string, string) {
	if p.IptablesSave == nil {
		return "nft", SourceDefault
	}
	for _, v := range []string{"nft", "legacy"} {
		if n := countLines(ctx, p, r, v, "mangle", isHintChain); n > 0 {
			return v, SourceHintChain
		}
	}
	nft := countLines(ctx, p, r, "nft", "", isRule)
	legacy := countLines(ctx, p, r, "legacy", "", isRule)
	r.note("iptables rules: nft %d, legacy %d", nft, legacy)
	switch {
	case legacy > nft:
		return "legacy", SourceRuleCount
	case nft > 0:
		return "nft", SourceRuleCount
	}
	return "nft", SourceDefault
}

func isHintChain(line string) bool {
	return strings.HasPrefix(line, ":KUBE-IPTABLES-HINT ") || strings.HasPrefix(line, ":KUBE-KUBELET-CANARY ")
}

func isRule(line string) bool { return strings.HasPrefix(line, "-") }

func countLines(ctx context.Context, p Probes, r *Result, variant, table string, match func(string) bool) int {
	n := 0
	for _, fam := range []string{"ipv4", "ipv6"} {
		out, err := p.IptablesSave(ctx, variant, fam, table)
		if err != nil {
			r.note("%s %s save: %v", variant, fam, err)
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			if match(strings.TrimSpace(line)) {
				n++
			}
		}
	}
	return n
}

func features(ctx context.Context, p Probes, r Result) *Features {
	if p.NFTTables == nil && p.ConntrackMatch == nil && p.Iptables == nil {
		return nil
	}
	f := &Features{}
	if p.NFTTables != nil {
		if _, err := p.NFTTables(ctx); err != nil {
			f.NFTablesErr = err.Error()
		} else {
			f.NFTables = true
		}
	}
	if p.Iptables != nil {
		if ipt, err := p.Iptables(r.IptablesVariant, "ipv4"); err != nil {
			f.IptablesErr = err.Error()
		} else {
			v1, v2, v3 := ipt.GetIptablesVersion()
			f.IptablesVersion = fmt.Sprintf("%d.%d.%d", v1, v2, v3)
			f.RandomFully = ipt.HasRandomFully()
		}
	}
	if p.ConntrackMatch != nil {
		if err := p.ConntrackMatch(ctx, r.IptablesVariant); err != nil {
			f.ConntrackMatchErr = err.Error()
		} else {
			f.ConntrackMatch = true
		}
	}
	return f
}

// ModeFromKubeProxyConfig reads `mode:` from a KubeProxyConfiguration (the ConfigMap's config.conf).
// An empty mode means kube-proxy's platform default, iptables on Linux.
func ModeFromKubeProxyConfig(conf string) (string, error) {
	var kpc struct {
		Kind string `json:"kind"`
		Mode string `json:"mode"`
	}
	if err := yamlUnmarshal([]byte(conf), &kpc); err != nil {
		return "", fmt.Errorf("config.conf: %w", err)
	}
	if kpc.Kind != "" && kpc.Kind != "KubeProxyConfiguration" {
		return "", fmt.Errorf("config.conf: kind %q is not KubeProxyConfiguration", kpc.Kind)
	}
	mode := strings.TrimSpace(kpc.Mode)
	if mode == "" {
		return "iptables", nil
	}
	if !knownMode(mode) {
		return "", fmt.Errorf("config.conf: mode %q is not one of %s", mode, strings.Join(ProxyModes, ", "))
	}
	return mode, nil
}

// once memoises a listing that two steps read.
func once(f func(context.Context) ([]string, error)) func(context.Context) ([]string, error) {
	var done bool
	var out []string
	var err error
	return func(ctx context.Context) ([]string, error) {
		if !done {
			out, err = f(ctx)
			done = true
		}
		return out, err
	}
}
