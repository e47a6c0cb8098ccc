package metadatablock

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ChainName is the fix's only chain ("NNM-METADATA-BLOCK" in iptables, "metadata-block" in nftables).
const ChainName = "METADATA-BLOCK"

// Params is what the core provides. Everything is injected: the backend (for counters) and the
// registry (for metrics); nothing global.
type Params struct {
	fx.In
	Backend  backend.Backend
	Registry prometheus.Registerer
}

type settings struct {
	addrs  []netip.Addr
	exempt []netip.Prefix
}

// Fix is the metadata-block fix.
type Fix struct {
	opts *fix.Settings[Config, settings]
}

var _ fix.RuleFix = (*Fix)(nil)

// New validates the defaults and registers the metrics. Constructors allocate only: no I/O, no
// goroutines.
func New(p Params) (*Fix, error) {
	opts, err := fix.NewSettings(ID, DefaultConfig, parse)
	if err != nil {
		return nil, err
	}
	if p.Registry != nil {
		if err := metrics.Register(p.Registry, newMetrics(p.Backend).collectors()...); err != nil {
			return nil, fmt.Errorf("%s: %w", ID, err)
		}
	}
	return &Fix{opts: opts}, nil
}

// ID is "metadata-block".
func (f *Fix) ID() string { return ID }

// Description is one line.
func (f *Fix) Description() string { return Description }

// DefaultEnabled is false: blocking is a policy choice the cluster owner makes.
func (f *Fix) DefaultEnabled(fix.Env) bool { return false }

// Needs the Node, for its pod CIDRs (which the core puts in Snapshot.PodCIDRs).
func (f *Fix) Needs() fix.Needs { return fix.Needs{Node: true} }

// Configure decodes and validates; on error the previous configuration stays.
func (f *Fix) Configure(options map[string]any) error { return f.opts.Configure(options) }

func parse(cfg Config) (settings, error) {
	var s settings
	if len(cfg.Addresses) == 0 {
		return s, fmt.Errorf("fixes.%s.addresses: name at least one address (disable the fix with enabled: false instead)", ID)
	}
	for _, a := range cfg.Addresses {
		addr, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return s, fmt.Errorf("fixes.%s.addresses: %q is not an IP address", ID, a)
		}
		if addr = addr.Unmap(); !slices.Contains(s.addrs, addr) {
			s.addrs = append(s.addrs, addr)
		}
	}
	slices.SortFunc(s.addrs, netip.Addr.Compare)
	exempt, err := rules.ParsePrefixes("fixes."+ID+".exemptSourceCIDRs", "", cfg.ExemptSourceCIDRs)
	if err != nil {
		return s, err
	}
	s.exempt = exempt
	return s, nil
}

// Rules returns one filter chain hooked at forward (pod traffic is routed through the node; the
// node's own traffic goes through output and is not touched): exempt sources return, then one drop
// per metadata address of the family, from the node's pod CIDRs. One code path for both families.
func (f *Fix) Rules(snap *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report, error) {
	cfg := f.opts.Get()
	var rep fix.Report
	var addrs []netip.Addr
	for _, a := range cfg.addrs {
		if family.Contains(a) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, rep, nil // nothing to block in this family: the core removes what we had
	}
	pods := snap.PodCIDRsOf(family)
	if len(pods) == 0 {
		rep.Skipped = append(rep.Skipped, fix.Skip{Object: "node", Reason: "no-pod-cidr",
			Detail: fmt.Sprintf("no %s pod CIDR (node.spec.podCIDRs or podCIDRs): cannot tell pod traffic apart", family)})
		return nil, rep, nil
	}
	c := rules.Chain{Name: ChainName, Type: rules.Filter, Hook: rules.Forward}
	var exempt []netip.Prefix
	for _, p := range cfg.exempt {
		if family.Contains(p.Addr()) {
			exempt = append(exempt, p)
		}
	}
	if len(exempt) > 0 {
		c.Rules = append(c.Rules, rules.Rule{Match: rules.Match{SrcPrefixes: exempt},
			Verdict: rules.Verdict{Kind: rules.Return}, Comment: "exempt source"})
	}
	for _, a := range addrs {
		c.Rules = append(c.Rules, rules.Rule{
			Match:   rules.Match{SrcPrefixes: pods, DstAddr: a},
			Verdict: rules.Verdict{Kind: rules.Drop},
			Counter: CounterName(a),
			Comment: "pods may not reach metadata " + a.String(),
		})
		rep.Covered++
	}
	return &rules.Ruleset{Fix: ID, Family: family, Chains: []rules.Chain{c}}, rep, nil
}

// CounterName is "dropped-169-254-169-254" (unique within the ruleset, readable in the kernel).
func CounterName(a netip.Addr) string {
	return "dropped-" + strings.NewReplacer(".", "-", ":", "-").Replace(a.String())
}
