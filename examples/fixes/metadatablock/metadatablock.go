package metadatablock

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ChainName is the fix's only chain ("NNM-METADATA-BLOCK" in iptables, "metadata-block" in nftables).
const ChainName = "METADATA-BLOCK"

type settings struct {
	addrs  []netip.Addr
	exempt []netip.Prefix
}

// Fix is the metadata-block fix. fix.Base implements what every fix has (ID, Description,
// DefaultEnabled, Needs, Configure) from the spec; the fix adds its Rules.
type Fix struct {
	fix.Base[Config, settings]
}

var _ fix.RuleFix = (*Fix)(nil)

// New validates the defaults and registers the metrics. Everything is injected (fix.Params): the
// backend (for counters) and the registry (for metrics); nothing global. Constructors allocate
// only: no I/O, no goroutines.
func New(p fix.Params) (*Fix, error) {
	f := &Fix{}
	if err := f.Init(spec, p, droppedPackets(p.Backend)); err != nil {
		return nil, err
	}
	return f, nil
}

func parse(cfg Config) (settings, error) {
	var s settings
	if len(cfg.Addresses) == 0 {
		return s, fix.Invalid("addresses", "name at least one address (disable the fix with enabled: false instead)")
	}
	var err error
	s.addrs, err = rules.ParseList("addresses", cfg.Addresses, func(a string) (netip.Addr, error) {
		addr, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return addr, fmt.Errorf("%q is not an IP address", a)
		}
		return addr.Unmap(), nil
	})
	if err != nil {
		return s, fix.OptionErr("addresses", err)
	}
	slices.SortFunc(s.addrs, netip.Addr.Compare)
	s.exempt, err = rules.ParsePrefixes("exemptSourceCIDRs", "", cfg.ExemptSourceCIDRs)
	return s, fix.OptionErr("exemptSourceCIDRs", err)
}

// Rules returns one filter chain hooked at forward (pod traffic is routed through the node; the
// node's own traffic goes through output and is not touched): exempt sources return, then one drop
// per metadata address of the family, from the node's pod CIDRs. One code path for both families.
func (f *Fix) Rules(snap *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report, error) {
	cfg := f.Config()
	var rep fix.Report
	addrs := family.Addrs(cfg.addrs)
	if len(addrs) == 0 {
		return nil, rep, nil // nothing to block in this family: the core removes what we had
	}
	pods := family.Prefixes(inputs.PodCIDRs.Get(snap))
	if len(pods) == 0 {
		rep.Skipped = append(rep.Skipped, fix.Skip{Object: "node", Reason: "no-pod-cidr",
			Detail: fmt.Sprintf("no %s pod CIDR (node.spec.podCIDRs or podCIDRs): cannot tell pod traffic apart", family)})
		return nil, rep, nil
	}
	c := rules.Chain{Name: ChainName, Type: rules.Filter, Hook: rules.Forward}
	if exempt := family.Prefixes(cfg.exempt); len(exempt) > 0 {
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
