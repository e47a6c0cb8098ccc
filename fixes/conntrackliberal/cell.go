// Package conntrackliberal sets net.netfilter.nf_conntrack_tcp_be_liberal=1, so that conntrack
// accepts out-of-window TCP segments instead of marking them INVALID: the kernel-level alternative to
// invalid-drop that kube-proxy offers as --conntrack-tcp-be-liberal (kubernetes#74839, #117924).
//
// It is the in-tree example of a fix that is not a netfilter rule: it implements fix.Actuator and
// changes the node only through the nodestate.Sysctl the core injects.
package conntrackliberal

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
)

// ID is the fix id: config key fixes.conntrack-liberal, metric label, log field.
const ID = "conntrack-liberal"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default, as invalid-drop is the default strategy (enable one or the other, or both:
// invalid-drop then reports itself redundant). It reads nothing from the Kubernetes API.
var spec = fix.Spec[Config, Config]{
	ID:          ID,
	Description: "set net.netfilter.nf_conntrack_tcp_be_liberal=1 so conntrack never marks out-of-window TCP INVALID (alternative to invalid-drop, kubernetes#74839)",
	Default:     func() Config { return Config{StateDir: DefaultStateDir} },
	Parse:       parse,
}

// DefaultStateDir is where the value found before the fix changed it is remembered. It is on tmpfs
// on every systemd host: cleared by a reboot, which also resets the sysctl to the kernel's default.
const DefaultStateDir = fix.StateDir

// Config is the fix's configuration (keys under fixes.conntrack-liberal).
type Config struct {
	// StateDir holds conntrack-liberal.json, the value to restore when the fix is disabled, so that
	// it survives agent restarts. Empty keeps it in memory only (lost on restart).
	StateDir string `mapstructure:"stateDir"`
}
