package mssclamp

import (
	"fmt"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ChainName is the fix's only chain: mangle, hooked at forward.
const ChainName = "MSS-CLAMP"

// Limits of a fixed MSS: 536 is the smallest MSS every IPv4 host must accept (RFC 9293); 65495 is
// the largest a 65535-byte IPv4 packet can carry.
const (
	MinMSS = 536
	MaxMSS = 65495
)

// Counter names of the two clamp rules (both start with "syn", which the metric sums).
const (
	CounterFromPods = "syn-from-pods"
	CounterToPods   = "syn-to-pods"
)

// Fix is the mss-clamp fix.
type Fix struct {
	fix.Base[Config, Config]
}

var _ fix.RuleFix = (*Fix)(nil)

// New builds the fix with its default configuration and registers its metrics.
func New(p fix.Params) (*Fix, error) {
	f := &Fix{}
	if err := f.Init(spec, p, synPackets(p.Backend)); err != nil {
		return nil, err
	}
	return f, nil
}

func parse(cfg Config) (Config, error) {
	if cfg.MSS != 0 && (cfg.MSS < MinMSS || cfg.MSS > MaxMSS) {
		return cfg, fix.Invalid("mss", "%d is out of range (0 clamps to the path MTU; a fixed MSS is %d to %d)", cfg.MSS, MinMSS, MaxMSS)
	}
	if cfg.PodInterfacePrefix != "" {
		if err := rules.ValidInterfacePrefix(cfg.PodInterfacePrefix); err != nil {
			return cfg, fix.Invalid("podInterfacePrefix", "%v", err)
		}
	}
	return cfg, nil
}

// Rules returns one mangle chain hooked at forward with two clamp rules: SYN and SYN-ACK segments
// leaving pods, and those going to pods. Both directions are needed: the MSS a pod announces reaches
// the remote peer in its SYN (pod-initiated) or SYN-ACK (remote-initiated), and so does the peer's.
func (f *Fix) Rules(snap *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report, error) {
	cfg := f.Config()
	clamp := rules.Verdict{Kind: rules.ClampMSS, MSS: uint16(cfg.MSS)}
	from := rules.Match{Protocol: rules.TCP, TCPFlags: rules.SYNNotRST}
	to := from
	var scope string
	if cfg.PodInterfacePrefix != "" {
		from.InInterfacePrefix, to.OutInterfacePrefix = cfg.PodInterfacePrefix, cfg.PodInterfacePrefix
		scope = "interfaces " + cfg.PodInterfacePrefix + "*"
	} else {
		pods := family.Prefixes(inputs.PodCIDRs.Get(snap))
		if len(pods) == 0 {
			return nil, fix.Report{Skipped: []fix.Skip{{
				Object: string(family), Reason: "no-pod-cidr",
				Detail: fmt.Sprintf("no %s pod CIDR known and no podInterfacePrefix: nothing to clamp", family),
			}}}, nil
		}
		from.SrcPrefixes, to.DstPrefixes = pods, pods
		scope = "pod CIDRs"
	}
	limit := "path MTU"
	if cfg.MSS != 0 {
		limit = fmt.Sprint(cfg.MSS)
	}
	rs := &rules.Ruleset{Fix: ID, Family: family, Chains: []rules.Chain{{
		Name: ChainName, Type: rules.Mangle, Hook: rules.Forward,
		Rules: []rules.Rule{
			{Match: from, Verdict: clamp, Counter: CounterFromPods, Comment: "clamp MSS of SYN from " + scope + " to " + limit},
			{Match: to, Verdict: clamp, Counter: CounterToPods, Comment: "clamp MSS of SYN to " + scope + " to " + limit},
		},
	}}}
	return rs, fix.Report{Covered: 1}, nil
}
