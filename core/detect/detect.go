// Package detect finds out what the agent needs to know about its node: kube-proxy's mode, which rule
// backend to use and which iptables variant. Every value can be set in the configuration; "auto"
// asks the probes. The result says how each value was found, for logs and the nnm_agent_info metric.
package detect

import (
	"context"

	"github.com/network-node-manager/network-node-manager/core/config"
)

// Result is what the agent runs with.
type Result struct {
	ProxyMode             string
	ProxyModeSource       string
	Backend               string
	BackendSource         string
	IptablesVariant       string
	IptablesVariantSource string
}

// Resolve turns "auto" settings into concrete values. Without probes, an unknown kube-proxy mode
// stays "" (so mode-specific fixes keep their conservative defaults), the backend is iptables and the
// iptables variant is nft.
func Resolve(_ context.Context, cfg *config.Config) Result {
	r := Result{
		ProxyMode: cfg.ProxyMode, ProxyModeSource: "config",
		Backend: cfg.Backend, BackendSource: "config",
		IptablesVariant: cfg.IptablesVariant, IptablesVariantSource: "config",
	}
	if r.ProxyMode == "auto" {
		r.ProxyMode, r.ProxyModeSource = "", "unknown"
	}
	if r.Backend == "auto" {
		r.Backend, r.BackendSource = "iptables", "default"
		if r.ProxyMode == "nftables" {
			r.Backend, r.BackendSource = "nftables", "proxy-mode"
		}
	}
	if r.IptablesVariant == "auto" {
		r.IptablesVariant, r.IptablesVariantSource = "nft", "default"
	}
	return r
}
