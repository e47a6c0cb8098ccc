package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/events"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// TestSameNamedForeignObjectBlocksTheFix (issue #63 row 1), with the real agent and API server: a
// table (nftables) or chain (iptables) named like invalid-drop's in IPv6 that someone else made,
// with a hooked chain or a rule of its own, is in the node's kernel before the agent starts. At main
// 3f85643 the nftables agent deleted the foreign chain without a log line and put its drop chains
// in that table, and `cleanup --dry-run` and `cleanup` left them hooked after an uninstall; the
// iptables agent flushed the foreign chain's rule and jumped to it. Now the fix is blocked in IPv6
// only: nnm_fix_blocked names the object, a FixBlocked Event on the Node says why, /healthz says
// blocked, the foreign object stays byte-identical; IPv4 is programmed; `cleanup --dry-run` lists
// the agent's IPv4 objects and not the foreign one, and `cleanup` removes exactly those.
func TestSameNamedForeignObjectBlocksTheFix(t *testing.T) {
	eachBackend(t, func(t *testing.T, c *cluster, backend string) {
		object, foreign := "table ip6 nnm-"+fixDrop, func(ns *netns.NS) string {
			return ns.MustOutput("nft", "list", "table", "ip6", "nnm-"+fixDrop)
		}
		setup := func(t *testing.T, ns *netns.NS) {
			ns.MustExec("nft", "add table ip6 nnm-"+fixDrop)
			ns.MustExec("nft", "add chain ip6 nnm-"+fixDrop+" input { type filter hook input priority 0 ; policy accept ; }")
			ns.MustExec("nft", "add rule ip6 nnm-"+fixDrop+" input tcp dport 22 accept")
		}
		if backend == "iptables" {
			// invalid-drop's chain is in the mangle table.
			object = "chain NNM-INVALID-INPUT of table mangle (ip6tables-nft)"
			foreign = func(ns *netns.NS) string { return ns.MustOutput("ip6tables-nft-save", "-t", "mangle") }
			setup = func(t *testing.T, ns *netns.NS) {
				ns.MustExec("ip6tables-nft", "-t", "mangle", "-N", "NNM-INVALID-INPUT")
				ns.MustExec("ip6tables-nft", "-t", "mangle", "-A", "NNM-INVALID-INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
			}
		}
		n := startNode(t, c, backend, nodeOptions{noWait: true, setup: setup, args: []string{"--iptables-variant", "nft"}})
		n.variant = "nft"
		before := comparable(foreign(n.ns))
		agenttest.Eventually(t, converge, func() error {
			if v, ok := n.agent.MetricsT(t).Value("nnm_fix_blocked", "fix", fixDrop, "family", "ipv6", "object", object); !ok || v != 1 {
				return fmt.Errorf("nnm_fix_blocked{fix=%s,family=ipv6,object=%q} = %v (exported %v)", fixDrop, object, v, ok)
			}
			return n.fixPresent(fixDrop, "ipv4")
		})
		agenttest.Eventually(t, eventsTimeout, func() error {
			for _, e := range withReason(nodeEvents(t, c, n.name), events.FixBlocked) {
				if e.Action == fixDrop && strings.Contains(e.Note, object+" exists and is not ours") {
					return nil
				}
			}
			return fmt.Errorf("no FixBlocked Event naming %s: %q", object, summary(nodeEvents(t, c, n.name)))
		})
		agenttest.Eventually(t, converge, func() error {
			code, body, err := n.agent.Get(t.Context(), "/healthz")
			if err != nil || code == 200 || !strings.Contains(body, "fix "+fixDrop+" (ipv6)") || !strings.Contains(body, "blocked") {
				return fmt.Errorf("/healthz %d %q %v, want it to name %s (ipv6) as blocked", code, body, err, fixDrop)
			}
			return nil
		})
		if v, ok := n.agent.MetricsT(t).Value("nnm_fix_blocked", "fix", fixDrop, "family", "ipv4"); ok {
			t.Errorf("nnm_fix_blocked for ipv4 = %v, want no sample", v)
		}
		if after := comparable(foreign(n.ns)); after != before {
			t.Errorf("the foreign %s changed:\n%s\nwas:\n%s", object, after, before)
		}

		// Uninstall: the dry run names the agent's objects only, and cleanup removes exactly them.
		if err := n.agent.Stop(agenttest.StopGrace); err != nil {
			t.Fatal(err)
		}
		bin, err := agenttest.Binary()
		if err != nil {
			t.Fatal(err)
		}
		plan := n.ns.MustOutput(bin, "cleanup", "--dry-run", "--iptables-variant", "nft")
		ours := "nftables: table ip nnm-" + fixDrop
		if backend == "iptables" {
			ours = "iptables-nft: table mangle chain NNM-INVALID-INPUT"
		}
		if !strings.Contains(plan, ours) || strings.Contains(plan, "ip6 nnm-"+fixDrop) || strings.Contains(plan, "ip6tables-nft: table mangle chain NNM-INVALID-INPUT") {
			t.Errorf("cleanup --dry-run:\n%s\nwant %q and nothing of the foreign %s", plan, ours, object)
		}
		n.ns.MustExec(bin, "cleanup", "--iptables-variant", "nft")
		if after := comparable(foreign(n.ns)); after != before {
			t.Errorf("cleanup changed the foreign %s:\n%s\nwas:\n%s", object, after, before)
		}
		if err := n.fixAbsent(fixDrop, "ipv4"); err != nil {
			t.Errorf("after cleanup: %v", err)
		}
	})
}

var counterValues = regexp.MustCompile(`\[\d+:\d+\]`)

// comparable is a listing without the lines that change by themselves (iptables-save's header and
// footer comments, counters).
func comparable(listing string) string {
	var b strings.Builder
	for _, l := range strings.Split(listing, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		b.WriteString(counterValues.ReplaceAllString(l, "") + "\n")
	}
	return b.String()
}
