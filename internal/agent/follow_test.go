package agent_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/detect"
)

// The follower's rule: kube-proxy's own answer is followed at once; other traces (and "no
// kube-proxy") only once they held for agent.FollowSettle, so a kube-proxy restarting in another
// mode does not make the agent flap through "none"; an unknown result changes nothing.
func TestDecide(t *testing.T) {
	ep := func(m string) detect.ProxyModeResult {
		return detect.ProxyModeResult{Mode: m, Source: detect.SourceMetricsEndpoint}
	}
	trace := func(m, src string) detect.ProxyModeResult { return detect.ProxyModeResult{Mode: m, Source: src} }
	unknown := detect.ProxyModeResult{Source: detect.SourceUnknown, Unknown: "nftables tables: permission denied"}
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	seen := func(m string, ago time.Duration) agent.Pending { return agent.Pending{Mode: m, Since: now.Add(-ago)} }
	settle := agent.FollowSettle
	for _, tc := range []struct {
		name    string
		running string
		pending agent.Pending
		r       detect.ProxyModeResult
		take    bool
		next    agent.Pending
	}{
		{"same mode", "ipvs", agent.Pending{}, ep("ipvs"), false, agent.Pending{}},
		{"same mode clears a pending one", "ipvs", seen("none", settle), trace("ipvs", detect.SourceIPVSLink), false, agent.Pending{}},
		{"kube-proxy answers another mode", "ipvs", agent.Pending{}, ep("nftables"), true, agent.Pending{}},
		{"kube-proxy answers while none is pending", "iptables", seen(detect.ModeNone, time.Second), ep("nftables"), true, agent.Pending{}},
		{"table seen first", "ipvs", agent.Pending{}, trace("nftables", detect.SourceNFTablesTable), false, seen("nftables", 0)},
		{"table seen, not yet settled", "ipvs", seen("nftables", settle-time.Second), trace("nftables", detect.SourceNFTablesTable), false, seen("nftables", settle-time.Second)},
		{"table seen for the settle time", "ipvs", seen("nftables", settle), trace("nftables", detect.SourceNFTablesTable), true, agent.Pending{}},
		{"kube-proxy gone, seen first", "iptables", agent.Pending{}, trace(detect.ModeNone, detect.SourceNoKubeProxy), false, seen(detect.ModeNone, 0)},
		{"kube-proxy gone for a restart's seconds", "iptables", seen(detect.ModeNone, 3*time.Second), trace(detect.ModeNone, detect.SourceNoKubeProxy), false, seen(detect.ModeNone, 3*time.Second)},
		{"kube-proxy gone for the settle time", "iptables", seen(detect.ModeNone, settle), trace(detect.ModeNone, detect.SourceNoKubeProxy), true, agent.Pending{}},
		{"a different trace restarts the wait", "ipvs", seen(detect.ModeNone, settle), trace("nftables", detect.SourceNFTablesTable), false, seen("nftables", 0)},
		{"unknown keeps everything", "ipvs", seen("nftables", time.Second), unknown, false, seen("nftables", time.Second)},
		{"kube-proxy back after none", detect.ModeNone, agent.Pending{}, ep("iptables"), true, agent.Pending{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			take, next := agent.Decide(tc.running, tc.pending, tc.r, now)
			if take != tc.take || next != tc.next {
				t.Errorf("Decide(%q, %+v, %+v) = %v, %+v; want %v, %+v", tc.running, tc.pending, tc.r, take, next, tc.take, tc.next)
			}
		})
	}
}

// docs/deploy.md, the page that explains following kube-proxy, quotes FollowSettle as it is.
func TestDocsQuoteFollowSettle(t *testing.T) {
	data, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("once every detection for %d s agreed", int(agent.FollowSettle.Seconds()))
	if !strings.Contains(strings.Join(strings.Fields(string(data)), " "), want) {
		t.Errorf("docs/deploy.md does not say %q", want)
	}
}
