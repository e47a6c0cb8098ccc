package diagnose

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackcapacity"
	"github.com/network-node-manager/network-node-manager/fixes/neighbourtable"
	"github.com/network-node-manager/network-node-manager/fixes/nodeportreservedports"
)

// Fix ids the checks name (the fixes' own ID constants live in fixes/, which the runtime does not
// import for the rule fixes; stale-udp-conntrack's judging code is imported, see staleudp.go).
const (
	fixInvalidDrop = "invalid-drop"
	fixLiberal     = "conntrack-liberal"
	fixIPVS        = "ipvs-externalip-dnat"
	fixMSSClamp    = "mss-clamp"
	fixStaleUDP    = "stale-udp-conntrack"
	fixCapacity    = conntrackcapacity.ID
	fixNeighbours  = neighbourtable.ID
	fixReserved    = nodeportreservedports.ID
)

// invalidCheck: replies marked INVALID reach the node (kubernetes#74839).
type invalidCheck struct{}

func (invalidCheck) ID() string { return "invalid-replies" }
func (invalidCheck) Title() string {
	return "packets conntrack marks INVALID (out-of-window replies) reach the node un-NATed and get reset (kubernetes#74839)"
}

// kubeProxyInvalidDrops finds kube-proxy's own INVALID drop (iptables: KUBE-FORWARD, with its
// packet counter; nftables: `ct state invalid drop` in table kube-proxy). found is false when none
// was seen; what says where it looked.
func kubeProxyInvalidDrops(ctx context.Context, env *Env) (found bool, packets uint64, what string) {
	if env.Kernel == nil {
		return false, 0, "not read"
	}
	switch env.ProxyMode {
	case "nftables":
		var seen []string
		for _, fam := range []string{"ip", "ip6"} {
			out, err := env.Kernel.NftList(ctx, "table", fam, "kube-proxy")
			if err != nil {
				continue
			}
			for _, line := range strings.Split(out, "\n") {
				// "ct state invalid drop", with a counter or an nfacct object between
				if strings.Contains(line, "ct state invalid") && strings.HasSuffix(strings.TrimSpace(line), "drop") {
					found = true
					seen = append(seen, fam)
					break
				}
			}
		}
		if !found {
			return false, 0, "no `ct state invalid drop` in kube-proxy's nftables tables"
		}
		return true, 0, "`ct state invalid drop` in table " + strings.Join(seen, "/") + " kube-proxy (forwarded traffic only; no counter)"
	case "iptables", "ipvs":
		var errs []string
		for _, fam := range rules.Families {
			// kube-proxy drops INVALID packets in KUBE-FORWARD, a chain of the filter table. The nat
			// table, which holds the per-Service rules of kube-proxy and of the agent's DNAT fix
			// (over 20,000 at 10,000 Services), is not read: its dump was the largest allocation
			// of the agent's periodic diagnosis.
			out, err := env.Kernel.IptablesSave(ctx, env.IptablesVariant, fam, "filter")
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			for _, r := range parseIptablesSave(out) {
				if strings.HasPrefix(r.Chain, "KUBE-") && strings.Contains(r.Rule, "--ctstate INVALID") && strings.HasSuffix(r.Rule, "-j DROP") {
					found = true
					packets += r.Packets
				}
			}
		}
		if !found {
			if len(errs) > 0 {
				return false, 0, "iptables not read: " + strings.Join(errs, "; ")
			}
			return false, 0, "no INVALID drop in kube-proxy's KUBE-* chains"
		}
		return true, packets, fmt.Sprintf("%d packets dropped by kube-proxy's INVALID drop (KUBE-FORWARD: forwarded traffic only, not INPUT)", packets)
	}
	return false, 0, "kube-proxy's mode is unknown"
}

func (invalidCheck) Run(ctx context.Context, env *Env) Finding {
	f := Finding{Remedy: "enable invalid-drop (fixes.invalid-drop.enabled: true), or conntrack-liberal (nf_conntrack_tcp_be_liberal=1)"}
	liberal := "unknown"
	if env.Sysctl != nil {
		if v, err := env.Sysctl.Get(nodestate.ConntrackTCPBeLiberal); err == nil {
			liberal = v
		} else {
			liberal = "unreadable: " + err.Error()
		}
	}
	f.Evidence = append(f.Evidence, ev(nodestate.ConntrackTCPBeLiberal, "%s", liberal))
	var invalid uint64
	statsOK := false
	if env.Stats != nil {
		if s, err := env.Stats.Stats(ctx); err == nil {
			invalid, statsOK = s.Invalid, true
			f.Evidence = append(f.Evidence, ev("conntrack invalid", "%d (summed over %d CPUs, since conntrack started in this namespace)", s.Invalid, s.CPUs))
		} else {
			f.Evidence = append(f.Evidence, ev("conntrack invalid", "unreadable: %v", err))
		}
	}
	f.counters = map[string]uint64{"invalid": invalid}
	_, _, kp := kubeProxyInvalidDrops(ctx, env)
	f.Evidence = append(f.Evidence, ev("kube-proxy INVALID drop", "%s", kp))
	drop, whyDrop, evDrop := env.inForce(ctx, fixInvalidDrop, ruleCounters(fixInvalidDrop))
	lib, whyLib, evLib := env.inForce(ctx, fixLiberal, liberalProof)
	f.Evidence = append(append(f.Evidence, evDrop...), evLib...)
	notInForce(&f, whyDrop, whyLib)
	switch {
	case drop:
		f.State, f.HandledBy = Handled, fixInvalidDrop
		f.Summary = "invalid-drop drops INVALID packets before the node answers them with a reset"
	case lib:
		f.State, f.HandledBy = Handled, fixLiberal
		f.Summary = "conntrack-liberal makes conntrack accept out-of-window TCP segments"
	case liberal == "1":
		f.State, f.Remedy = OK, ""
		f.Summary = "nf_conntrack_tcp_be_liberal=1: out-of-window segments are not marked INVALID"
	case !statsOK:
		return Finding{State: CannotTell, Summary: "conntrack's statistics cannot be read (needs CAP_NET_ADMIN in the node's network namespace)", Evidence: f.Evidence, Remedy: f.Remedy}
	case invalid == 0:
		f.State, f.Remedy = OK, ""
		f.Summary = "no packet was marked INVALID"
	case risen(env, "invalid-replies", "invalid", invalid, &f) == 0:
		f.State, f.Remedy = OK, ""
		f.Summary = "no packet was marked INVALID since the last run"
	default:
		f.State = Problem
		f.Summary = fmt.Sprintf("%d packets were marked INVALID and no enabled fix drops them before the node answers with a reset", invalid)
		f.Summary += whyNot(whyDrop, whyLib)
	}
	return f
}

// liberalProof is conntrack-liberal's proof: the sysctl holds 1 now.
func liberalProof(_ context.Context, env *Env) (bool, string) {
	if env.Sysctl == nil {
		return false, nodestate.ConntrackTCPBeLiberal + " cannot be read here"
	}
	v, err := env.Sysctl.Get(nodestate.ConntrackTCPBeLiberal)
	if err != nil {
		return false, nodestate.ConntrackTCPBeLiberal + " cannot be read: " + err.Error()
	}
	if v != "1" {
		return false, nodestate.ConntrackTCPBeLiberal + " is " + v + ", not 1"
	}
	return true, nodestate.ConntrackTCPBeLiberal + " is 1"
}

// notInForce adds to f's evidence why each enabled fix does not handle the problem ("" for a fix
// that is simply not enabled).
func notInForce(f *Finding, whys ...string) {
	for _, w := range whys {
		if w != "" {
			f.Evidence = append(f.Evidence, ev("not in force", "%s", w))
			if f.NotInForce != "" {
				f.NotInForce += "; "
			}
			f.NotInForce += w
		}
	}
}

// whyNot is the tail of a problem's summary naming the enabled fixes that do not handle it now.
func whyNot(whys ...string) string {
	var parts []string
	for _, w := range whys {
		if w != "" {
			parts = append(parts, w)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// iptRule is one rule of iptables-save -c output.
type iptRule struct {
	Table, Chain, Rule string
	Packets, Bytes     uint64
}

var iptRuleRE = regexp.MustCompile(`^\[(\d+):(\d+)\] -A (\S+) (.*)$`)

func parseIptablesSave(text string) []iptRule {
	var out []iptRule
	table := ""
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "*") {
			table = strings.TrimPrefix(line, "*")
			continue
		}
		m := iptRuleRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		p, _ := strconv.ParseUint(m[1], 10, 64)
		b, _ := strconv.ParseUint(m[2], 10, 64)
		out = append(out, iptRule{Table: table, Chain: m[3], Rule: m[4], Packets: p, Bytes: b})
	}
	return out
}

// ConntrackFillLimit is the share of nf_conntrack_max above which the table is reported as nearly
// full.
const ConntrackFillLimit = 0.9

// conntrackFillCheck: table fill and the counters of lost connections (conntrack-capacity).
type conntrackFillCheck struct{}

func (conntrackFillCheck) ID() string { return "conntrack-table" }
func (conntrackFillCheck) Title() string {
	return "the conntrack table is nearly full, or connections are lost (drop, early_drop, insert_failed) (kubernetes#18604)"
}

func (conntrackFillCheck) Run(ctx context.Context, env *Env) Finding {
	if env.Stats == nil {
		return cannot("conntrack's statistics are not readable here")
	}
	s, err := env.Stats.Stats(ctx)
	if err != nil {
		return cannot("conntrack's statistics cannot be read: %v", err)
	}
	f := Finding{Remedy: "enable conntrack-capacity (fixes.conntrack-capacity.enabled: true), or find what fills the table (conntrack -L)"}
	fill, size := 0.0, "unreadable"
	var o conntrackcapacity.Observation
	if env.Sysctl != nil {
		n, err1 := env.Sysctl.Get(conntrackcapacity.Count)
		m, err2 := env.Sysctl.Get(conntrackcapacity.Max)
		b, _ := env.Sysctl.Get(conntrackcapacity.Buckets)
		if err1 == nil && err2 == nil {
			o.Entries, o.Max, o.Buckets = atoi(n), atoi(m), atoi(b)
			if o.Max > 0 {
				fill = float64(o.Entries) / float64(o.Max)
				size = fmt.Sprintf("%d of nf_conntrack_max %d (%.0f%%)", o.Entries, o.Max, 100*fill)
			}
		}
	}
	f.Evidence = []Evidence{
		ev("entries", "%s", size),
		ev("drop", "%d (packets dropped: the table was full)", s.Drop),
		ev("early_drop", "%d (entries evicted to make room)", s.EarlyDrop),
		ev("insert_failed", "%d (entries that lost an insertion race)", s.InsertFailed),
	}
	var bad []string
	sizeBad, insertBad := fill >= ConntrackFillLimit, false
	if sizeBad {
		bad = append(bad, fmt.Sprintf("the table is %.0f%% full", 100*fill))
	}
	f.counters = map[string]uint64{"drop": s.Drop, "early_drop": s.EarlyDrop, "insert_failed": s.InsertFailed}
	for _, c := range []struct {
		name string
		n    uint64
	}{{"drop", s.Drop}, {"early_drop", s.EarlyDrop}, {"insert_failed", s.InsertFailed}} {
		if c.n > 0 && risen(env, "conntrack-table", c.name, c.n, &f) > 0 {
			bad = append(bad, fmt.Sprintf("%s=%d", c.name, c.n))
			if c.name == "insert_failed" {
				insertBad = true
			} else {
				o.Lost += c.n
				sizeBad = true
			}
		}
	}
	if len(bad) == 0 {
		since := ""
		if env.Previous != nil {
			since = " since the last run"
		}
		f.State, f.Summary, f.Remedy = OK, fmt.Sprintf("the table is %.0f%% full, no connection lost%s", 100*fill, since), ""
		return f
	}
	// conntrack-capacity handles a table that is too small while it is in force and the table holds
	// what the fix asks for now, within its bound. insert_failed alone (clashing inserts: the DNS
	// race, fixed in the kernel) is not a size problem.
	grow, why, evs := env.inForce(ctx, fixCapacity, func(_ context.Context, env *Env) (bool, string) {
		opts, err := conntrackcapacity.Options(env.Options[fixCapacity])
		if err != nil {
			return false, "its options do not parse: " + err.Error()
		}
		if o.MemoryBytes, o.CPUs, err = env.host(); err != nil {
			return false, "the node's memory cannot be read: " + err.Error()
		}
		if env.Previous == nil {
			o.Lost = 0 // counted since conntrack started, not since the fix's last pass
		}
		d := conntrackcapacity.Desired(o, opts)
		switch {
		case d.Limited && d.Max <= o.Max:
			return false, fmt.Sprintf("nf_conntrack_max %d is at its bound %d (maxMemoryPercent %v of the node's memory)", o.Max, d.Bound, opts.MaxMemoryPercent)
		case d.Max > o.Max:
			return false, fmt.Sprintf("nf_conntrack_max is %d; the fix raises it to %d on its next pass (%s)", o.Max, d.Max, d.Why)
		}
		return true, fmt.Sprintf("nf_conntrack_max %d within its bound %d", o.Max, d.Bound)
	})
	f.Evidence = append(f.Evidence, evs...)
	notInForce(&f, why)
	if grow && sizeBad && !insertBad {
		f.State, f.HandledBy = Handled, fixCapacity
		f.Summary = strings.Join(bad, ", ") + "; conntrack-capacity sizes the table to what it holds"
		return f
	}
	f.State, f.Summary = Problem, strings.Join(bad, ", ")+whyNot(why)
	return f
}

// risen is how much counter name of check rose since the agent's previous run, noted in f's
// evidence; without a previous run (the command) it is now itself (the count since conntrack
// started).
func risen(env *Env, check, name string, now uint64, f *Finding) uint64 {
	d, ok := env.rise(check, name, now)
	if !ok {
		return now
	}
	f.Evidence = append(f.Evidence, ev(name+" since the last run", "+%d", d))
	return d
}
