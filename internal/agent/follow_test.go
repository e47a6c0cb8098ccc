package agent_test

import (
	"testing"

	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/detect"
)

// The follower's rule: kube-proxy's own answer is followed at once; other traces (and "no
// kube-proxy") only when two detections in a row agree, so a kube-proxy restarting in another mode
// does not make the agent flap through "none"; an unknown result changes nothing.
func TestDecide(t *testing.T) {
	ep := func(m string) detect.ProxyModeResult {
		return detect.ProxyModeResult{Mode: m, Source: detect.SourceMetricsEndpoint}
	}
	trace := func(m, src string) detect.ProxyModeResult { return detect.ProxyModeResult{Mode: m, Source: src} }
	unknown := detect.ProxyModeResult{Source: detect.SourceUnknown, Unknown: "nftables tables: permission denied"}
	for _, tc := range []struct {
		name             string
		running, pending string
		r                detect.ProxyModeResult
		take             bool
		next             string
	}{
		{"same mode", "ipvs", "", ep("ipvs"), false, ""},
		{"same mode clears a pending one", "ipvs", "none", trace("ipvs", detect.SourceIPVSLink), false, ""},
		{"kube-proxy answers another mode", "ipvs", "", ep("nftables"), true, ""},
		{"table seen once", "ipvs", "", trace("nftables", detect.SourceNFTablesTable), false, "nftables"},
		{"table seen twice", "ipvs", "nftables", trace("nftables", detect.SourceNFTablesTable), true, ""},
		{"kube-proxy gone, seen once", "iptables", "", trace(detect.ModeNone, detect.SourceNoKubeProxy), false, detect.ModeNone},
		{"kube-proxy gone, seen twice", "iptables", detect.ModeNone, trace(detect.ModeNone, detect.SourceNoKubeProxy), true, ""},
		{"a different trace replaces the pending one", "ipvs", detect.ModeNone, trace("nftables", detect.SourceNFTablesTable), false, "nftables"},
		{"unknown keeps everything", "ipvs", "nftables", unknown, false, "nftables"},
		{"kube-proxy back after none", detect.ModeNone, "", ep("iptables"), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			take, next := agent.Decide(tc.running, tc.pending, tc.r)
			if take != tc.take || next != tc.next {
				t.Errorf("Decide(%q, %q, %+v) = %v, %q; want %v, %q", tc.running, tc.pending, tc.r, take, next, tc.take, tc.next)
			}
		})
	}
}
