package diagnose

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// JSON writes r as the versioned JSON document (SchemaVersion), indented.
func JSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// label is a state as the text output shows it.
func (f Finding) label() string {
	switch f.State {
	case Handled:
		return "handled by " + f.HandledBy
	case CannotTell:
		return "cannot tell"
	}
	return string(f.State)
}

// Text writes r for a person: a header, then per check its state, summary, evidence and remedy.
func Text(w io.Writer, r *Report) error {
	var b strings.Builder
	node := r.Node
	if node == "" {
		node = "(node name unknown)"
	}
	mode := r.ProxyMode
	if mode == "" {
		mode = "unknown"
	}
	if r.ProxyModeSource != "" {
		mode += " (from " + r.ProxyModeSource + ")"
	}
	fmt.Fprintf(&b, "node %s, kube-proxy mode %s, API: %s\n", node, mode, r.API)
	var on []string
	for _, f := range r.Fixes {
		switch {
		case f.Refused != "":
			on = append(on, f.ID+" (refused)")
		case f.Enabled:
			on = append(on, f.ID)
		}
	}
	if len(on) == 0 {
		on = []string{"none"}
	}
	cfg := ""
	if r.Override != "" {
		cfg = " (config: " + r.Override + ")"
	}
	fmt.Fprintf(&b, "enabled fixes: %s%s\n", strings.Join(on, ", "), cfg)
	if r.Agent != "" {
		fmt.Fprintf(&b, "fixes' state: %s\n", r.Agent)
	}
	for _, f := range r.Findings {
		tag := ""
		if f.ReportOnly {
			tag = " [report only]"
		}
		fmt.Fprintf(&b, "\n%-20s %s%s\n", f.Check, strings.ToUpper(f.label()), tag)
		fmt.Fprintf(&b, "  %s\n", f.Summary)
		for _, e := range f.Evidence {
			fmt.Fprintf(&b, "    %s: %s\n", e.Name, e.Value)
		}
		if f.Remedy != "" && f.State != Handled {
			fmt.Fprintf(&b, "  → %s\n", f.Remedy)
		}
	}
	switch r.Open {
	case 0:
		fmt.Fprintf(&b, "\nno problem that an enabled fix leaves open\n")
	default:
		fmt.Fprintf(&b, "\n%s that no enabled fix handles (exit status %d)\n", plural(r.Open, "problem"), ExitProblem)
	}
	if n := r.Problems - r.Open; n > 0 {
		fmt.Fprintf(&b, "%s that no fix of the agent handles (report only; acknowledgedChecks silences one)\n", plural(n, "problem"))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// plural is "1 problem", "2 problems".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
