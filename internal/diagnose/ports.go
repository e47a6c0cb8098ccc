package diagnose

import (
	"context"
	"fmt"

	"github.com/network-node-manager/network-node-manager/core/inputs"
	npr "github.com/network-node-manager/network-node-manager/fixes/nodeportreservedports"
)

// nodePortCheck: NodePorts inside the ephemeral port range that ip_local_reserved_ports does not
// hold (nodeport-reserved-ports).
type nodePortCheck struct{}

func (nodePortCheck) ID() string { return "nodeport-ephemeral" }
func (nodePortCheck) Title() string {
	return "NodePorts inside the ephemeral port range: a host process or a masqueraded connection can take one as its source port (kubernetes#108496, #111682)"
}

func (nodePortCheck) Run(ctx context.Context, env *Env) Finding {
	if env.Sysctl == nil {
		return cannot("%v", errNoKernel)
	}
	o, err := npr.Observe(env.Sysctl)
	if err != nil {
		return cannot("%v", err)
	}
	// Judged with the fix's options as configured (its NodePort range; in-use: the Services'
	// NodePorts), its defaults when it is not configured.
	opts, err := npr.Options(env.Options[fixReserved])
	if err != nil {
		return cannot("fixes.%s's options do not parse: %v", fixReserved, err)
	}
	if opts.Reserve == npr.ReserveInUse {
		if why := env.missing(inputs.Services); why != "" {
			return cannot("the Services (their NodePorts) cannot be read: %s", why)
		}
		o.InUse = npr.InUse(inputs.Services.Get(env.Cluster))
	}
	d := npr.Desired(o, opts)
	what := "NodePort range " + opts.NodePorts.String()
	if opts.Reserve == npr.ReserveInUse {
		what = fmt.Sprintf("NodePorts in use (%d)", npr.Count(o.InUse))
	}
	f := Finding{Remedy: "enable nodeport-reserved-ports (fixes.nodeport-reserved-ports.enabled: true; set nodePortRange to kube-apiserver's --service-node-port-range)",
		Evidence: []Evidence{
			ev(npr.LocalPortRange, "%s", o.Ephemeral),
			ev(npr.ReservedPorts, "%s", portsOrNone(o.Reserved)),
			ev(what+" inside the ephemeral range", "%s", portsOrNone(d.Overlap)),
		}}
	if len(d.Open) == 0 {
		f.State, f.Remedy = OK, ""
		f.Summary = "no NodePort can be taken as an ephemeral source port (" + what + ", ephemeral " + o.Ephemeral.String() + ")"
		if len(d.Overlap) > 0 {
			f.Summary = "the NodePorts inside the ephemeral range are reserved"
		}
		if in, _, evs := env.inForce(ctx, fixReserved, nil); in && len(d.Overlap) > 0 {
			f.State, f.HandledBy, f.Evidence = Handled, fixReserved, append(f.Evidence, evs...)
			f.Summary = "nodeport-reserved-ports reserves the NodePorts inside the ephemeral range"
		}
		return f
	}
	_, why, evs := env.inForce(ctx, fixReserved, nil)
	f.Evidence = append(f.Evidence, evs...)
	notInForce(&f, why)
	if why == "" && env.Enabled(fixReserved) {
		why = "nodeport-reserved-ports is in force but " + npr.ReservedPorts + " does not hold them"
		notInForce(&f, why)
	}
	f.State = Problem
	f.Summary = fmt.Sprintf("%d NodePorts (%s) are inside the ephemeral port range %s and not reserved", npr.Count(d.Open), npr.FormatPorts(d.Open), o.Ephemeral) + whyNot(why)
	return f
}

func portsOrNone(rs []npr.Range) string {
	if len(rs) == 0 {
		return "none"
	}
	return npr.FormatPorts(rs)
}
