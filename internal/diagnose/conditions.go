package diagnose

import (
	"slices"
	"strings"
	"unicode"

	corev1 "k8s.io/api/core/v1"
)

// ConditionTypes are the Node condition types the agent publishes, one per check (a problem class,
// node-problem-detector's way): True while the check finds a problem that no enabled fix handles.
// They are the agent's own: it patches, and `cleanup` removes, only these.
var ConditionTypes = map[string]corev1.NodeConditionType{
	"invalid-replies":      "ConntrackInvalidResets",
	"ipvs-external-ip":     "IPVSExternalIPBlackhole",
	"nft-no-endpoint-drop": "NFTablesExternalIPDrop",
	"pmtu":                 "PathMTUBlackhole",
	"stale-udp":            "StaleUDPConntrack",
	"conntrack-table":      "ConntrackTableFull",
	"neighbour-table":      "NeighbourTableFull",
	"nodeport-ephemeral":   "NodePortEphemeralOverlap",
	"rp-filter":            "StrictReversePathFilter",
	"nftables-migration":   "NFTablesMigrationBlocked",
}

// ConditionTypeList is the agent's condition types, sorted and comma-separated (for messages).
func ConditionTypeList() string {
	var out []string
	for _, t := range ConditionTypes {
		out = append(out, string(t))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// The conditions' reasons (CamelCase, as the API's conventions ask).
const (
	ReasonNoProblem     = "NoProblem"
	ReasonAcknowledged  = "Acknowledged"
	ReasonCannotTell    = "CannotTell"
	ReasonFixNotEnabled = "NoEnabledFix"    // a fix of the agent would handle it; none is enabled
	ReasonFixNotInForce = "FixNotInForce"   // a fix is enabled but does not handle it now
	ReasonNoFix         = "NoFixInTheAgent" // report only: no fix of the agent handles it
	reasonHandledBy     = "HandledBy"       // + the fix in CamelCase: HandledByConntrackCapacity
)

// MaxConditionMessage bounds a condition's message (the finding's summary).
const MaxConditionMessage = 512

// Conditions are r's findings as Node conditions, in the checks' order, without times (the
// publisher sets them): one per check with a type in ConditionTypes.
func Conditions(r *Report) []corev1.NodeCondition {
	var out []corev1.NodeCondition
	for _, f := range r.Findings {
		t, ok := ConditionTypes[f.Check]
		if !ok {
			continue
		}
		c := corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Message: f.Summary}
		switch f.State {
		case OK:
			c.Reason = ReasonNoProblem
		case Handled:
			c.Reason = reasonHandledBy + camel(f.HandledBy)
		case Acknowledged:
			c.Reason = ReasonAcknowledged
			c.Message = "acknowledged (acknowledgedChecks): " + f.Summary
		case CannotTell:
			c.Status, c.Reason = corev1.ConditionUnknown, ReasonCannotTell
		case Problem:
			c.Status = corev1.ConditionTrue
			switch {
			case f.ReportOnly:
				c.Reason = ReasonNoFix
			case f.NotInForce != "":
				c.Reason = ReasonFixNotInForce
			default:
				c.Reason = ReasonFixNotEnabled
			}
		}
		if len(c.Message) > MaxConditionMessage {
			c.Message = c.Message[:MaxConditionMessage-3] + "..."
		}
		out = append(out, c)
	}
	return out
}

// camel is a kebab-case id in CamelCase: conntrack-capacity → ConntrackCapacity.
func camel(id string) string {
	var b strings.Builder
	up := true
	for _, r := range id {
		switch {
		case r == '-':
			up = true
		case up:
			b.WriteRune(unicode.ToUpper(r))
			up = false
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
