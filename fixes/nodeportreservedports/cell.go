// Package nodeportreservedports keeps the cluster's NodePort range (or the NodePorts in use) out of
// the node's ephemeral port range, by adding where they overlap to net.ipv4.ip_local_reserved_ports
// (which IPv6 follows too). Since kube-proxy stopped holding a socket on each NodePort
// (kubernetes#108496), a node whose ip_local_port_range covers NodePorts lets a host process, or a
// masqueraded connection, take a NodePort as its source port; IPVS mode then takes the
// connection's replies for the Service (kubernetes#111682, #139276). Cilium protects its NodePort
// range the same way (cilium#10782).
package nodeportreservedports

import (
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
)

// ID is the fix id: config key fixes.nodeport-reserved-ports, metric label, log field.
const ID = "nodeport-reserved-ports"

// Module registers the fix.
var Module = fix.Module(spec, New)

// spec: off by default. It reads the Services (their NodePorts, for reserve: in-use).
var spec = fix.Spec[Config, Settings]{
	ID:          ID,
	Description: "reserve the NodePort range (or the NodePorts in use) where it overlaps the ephemeral port range, in net.ipv4.ip_local_reserved_ports (kubernetes#108496)",
	Default: func() Config {
		return Config{NodePortRange: "30000-32767", Reserve: ReserveRange, StateDir: fix.StateDir}
	},
	Parse: parse,
	Reads: []fix.TableRef{inputs.Services},
}

// What Config.Reserve accepts.
const (
	ReserveRange = "range"
	ReserveInUse = "in-use"
)

// Config is the fix's configuration (keys under fixes.nodeport-reserved-ports).
type Config struct {
	// NodePortRange is the cluster's NodePort range: kube-apiserver's --service-node-port-range.
	NodePortRange string `mapstructure:"nodePortRange"`
	// Reserve is "range" (the whole NodePort range where it overlaps the ephemeral range) or
	// "in-use" (only the NodePorts that Services use now: fewer ports taken from the ephemeral range;
	// a port stays reserved once a Service used it, until the fix is disabled).
	Reserve string `mapstructure:"reserve"`
	// StateDir holds nodeport-reserved-ports.json, the value to restore when the fix is disabled.
	// Empty keeps it in memory only (lost on restart).
	StateDir string `mapstructure:"stateDir"`
}
