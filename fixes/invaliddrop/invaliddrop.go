package invaliddrop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Comment is carried by every drop rule.
const Comment = "drop conntrack INVALID (kubernetes#74839)"

var hookRank = map[rules.Hook]int{rules.Input: 0, rules.Forward: 1}

// settings is a validated Config.
type settings struct {
	hooks     []rules.Hook
	protocols []rules.Protocol
	exempt    []netip.Prefix
}

// Fix is the invalid-drop fix.
type Fix struct {
	fix.Base[Config, settings]
	sysctl nodestate.Sysctl
	m      *fixMetrics
	// redundant is the last be_liberal state seen by Observe, so the log line is written once.
	redundant atomic.Bool
}

var (
	_ fix.RuleFix  = (*Fix)(nil)
	_ fix.Observer = (*Fix)(nil)
)

// New builds the fix with its default configuration and registers its metrics.
func New(p fix.Params) (*Fix, error) {
	f := &Fix{sysctl: p.Sysctl}
	f.m = newMetrics(p.Backend, func() bool { r, _ := f.beLiberal(); return r })
	if err := f.Init(spec, p, f.m.collectors()...); err != nil {
		return nil, err
	}
	return f, nil
}

func parse(cfg Config) (settings, error) {
	var s settings
	if len(cfg.Hooks) == 0 {
		return s, fix.Invalid("hooks", "must name at least one of input, forward (disable the fix with enabled: false instead)")
	}
	var err error
	s.hooks, err = rules.ParseList("hooks", cfg.Hooks, func(h string) (rules.Hook, error) {
		hook, err := rules.ParseHook(h)
		if err != nil || (hook != rules.Input && hook != rules.Forward) {
			return "", fmt.Errorf("%q is not a valid hook (want input or forward)", h)
		}
		return hook, nil
	})
	if err != nil {
		return s, fix.OptionErr("hooks", err)
	}
	// Input before forward, whatever order the config used.
	slices.SortFunc(s.hooks, func(a, b rules.Hook) int { return hookRank[a] - hookRank[b] })
	s.protocols, err = rules.ParseList("protocols", cfg.Protocols, func(p string) (rules.Protocol, error) {
		proto, err := rules.ParseProtocol(p)
		if err != nil {
			return "", fmt.Errorf("%q is not a valid protocol (want tcp, udp or sctp)", p)
		}
		return proto, nil
	})
	if err != nil {
		return s, fix.OptionErr("protocols", err)
	}
	slices.Sort(s.protocols)
	s.exempt, err = rules.ParsePrefixes("exemptSourceCIDRs", "", cfg.ExemptSourceCIDRs)
	return s, fix.OptionErr("exemptSourceCIDRs", err)
}

// Rules returns one mangle chain per configured hook: exemptions first, then the drop. The mangle
// table runs before filter on the same hook and sees ct state, so the drop comes before any filter
// rule that could ACCEPT the INVALID packet (Calico's cali-INPUT, kube-proxy's KUBE-NODEPORTS),
// wherever other agents put their jumps: no position to contend for (backends/iptables README,
// "Position among other agents").
func (f *Fix) Rules(_ *fix.Snapshot, family rules.Family) (*rules.Ruleset, fix.Report, error) {
	cfg := f.Config()
	exempt := family.Prefixes(cfg.exempt)
	rs := &rules.Ruleset{Fix: ID, Family: family}
	for _, hook := range cfg.hooks {
		c := rules.Chain{Name: ChainName(hook), Type: rules.Mangle, Hook: hook}
		if len(exempt) > 0 {
			c.Rules = append(c.Rules, rules.Rule{
				Match:   rules.Match{SrcPrefixes: exempt, CTStates: []rules.CTState{rules.CTInvalid}},
				Verdict: rules.Verdict{Kind: rules.Return},
				Comment: "exempt source",
			})
		}
		protos := cfg.protocols
		if len(protos) == 0 {
			protos = []rules.Protocol{""}
		}
		for _, p := range protos {
			c.Rules = append(c.Rules, rules.Rule{
				Match:   rules.Match{CTStates: []rules.CTState{rules.CTInvalid}, Protocol: p},
				Verdict: rules.Verdict{Kind: rules.Drop},
				Counter: CounterName(hook, p),
				Comment: Comment,
			})
		}
		rs.Chains = append(rs.Chains, c)
	}
	return rs, fix.Report{Covered: len(cfg.hooks)}, nil
}

// ChainName is "INVALID-INPUT" or "INVALID-FORWARD".
func ChainName(h rules.Hook) string { return "INVALID-" + strings.ToUpper(string(h)) }

// CounterName names the drop counter of a hook and protocol: "dropped-input", "dropped-input-tcp".
// Counter names are unique within a ruleset, so the hook is part of it.
func CounterName(h rules.Hook, p rules.Protocol) string {
	if p == "" {
		return "dropped-" + string(h)
	}
	return "dropped-" + string(h) + "-" + string(p)
}

// beLiberal reports whether conntrack's be_liberal mode is on, which makes the drop redundant.
func (f *Fix) beLiberal() (bool, error) {
	if f.sysctl == nil {
		return false, errors.New("no sysctl access")
	}
	v, err := f.sysctl.Get(nodestate.ConntrackTCPBeLiberal)
	return err == nil && v == "1", err
}

// Observe says once, in the log, when conntrack's be_liberal mode makes the drop redundant (the
// nnm_invalid_drop_redundant gauge reads the sysctl itself at scrape time).
func (f *Fix) Observe(_ context.Context, family rules.Family, _ fix.Report) {
	redundant, err := f.beLiberal()
	if err != nil {
		f.Log.Debug("cannot read sysctl; assuming the drop is needed", "sysctl", nodestate.ConntrackTCPBeLiberal, "err", err)
	}
	changed := f.redundant.Swap(redundant) != redundant
	if changed && redundant {
		f.Log.Info("the INVALID drop is redundant: conntrack accepts out-of-window TCP segments because "+nodestate.ConntrackTCPBeLiberal+"=1; disable this fix or keep it as a safety net",
			"sysctl", nodestate.ConntrackTCPBeLiberal)
	}
}
