package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

const fixMSS = "mss-clamp"

// One config enables mss-clamp only on the nodes a nodeOverrides selector picks (pool=canary). Two
// agents, each for its own Node and in its own network namespace, read the same file against the
// real kube-apiserver: the clamp's rules appear on the canary node only, and
// nnm_config_node_override names the entry there and none on the other. Swapping the two Nodes'
// labels (a patch, as `kubectl label` does) moves the rules to the other node within the
// convergence bound, with neither agent restarted.
func TestNodeOverridesFollowNodeLabels(t *testing.T) {
	require(t)
	c := sharedCluster(t, "nftables")
	const config = `# written by the e2e test
configVersion: 1
fixes:
  invalid-drop: {enabled: true}
  ipvs-externalip-dnat: {enabled: false}
  mss-clamp: {enabled: false}
nodeOverrides:
- nodeSelector:
    matchLabels: {pool: canary}
  fixes:
    mss-clamp: {enabled: true}
`
	withNode := func(pool string) func(t *testing.T, ns *netns.NS) {
		return func(t *testing.T, ns *netns.NS) {
			name := "node-" + ns.Name[len(ns.Name)-8:] // startNode's name for the netns
			nodes := c.admin.CoreV1().Nodes()
			if _, err := nodes.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
				Labels: map[string]string{"pool": pool}}}, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create node %s: %v", name, err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = nodes.Delete(ctx, name, metav1.DeleteOptions{})
			})
		}
	}
	canary := startNode(t, c, "nftables", nodeOptions{config: config, setup: withNode("canary")})
	general := startNode(t, c, "nftables", nodeOptions{config: config, setup: withNode("general")})
	restarts := map[*node]int{canary: canary.agent.PID(), general: general.agent.PID()}

	// expect waits until the clamp is on `on` and nowhere on `off`, in both families, and the
	// metric says which entry applies on each.
	expect := func(on, off *node) {
		t.Helper()
		agenttest.Eventually(t, converge, func() error {
			for _, fam := range []string{"ipv4", "ipv6"} {
				if _, out, err := on.fixTable(fixMSS, fam); err != nil || !strings.Contains(out, "maxseg") {
					return fmt.Errorf("%s: no %s clamp (err %v):\n%s", on.name, fam, err, out)
				}
				if _, out, err := off.fixTable(fixMSS, fam); err != nil || out != "" {
					return fmt.Errorf("%s: a %s clamp where no override enables it (err %v):\n%s", off.name, fam, err, out)
				}
			}
			if v, _ := on.metrics().Value("nnm_config_node_override", "override", "0"); v != 1 {
				return fmt.Errorf("%s: nnm_config_node_override{override=0} = %v, want 1", on.name, v)
			}
			if v, _ := off.metrics().Value("nnm_config_node_override", "override", "none"); v != 1 {
				return fmt.Errorf("%s: nnm_config_node_override{override=none} = %v, want 1", off.name, v)
			}
			return nil
		})
		// invalid-drop, which no entry touches, stays on both.
		for _, n := range []*node{on, off} {
			if err := n.fixPresent(fixDrop, "ipv4"); err != nil {
				t.Fatalf("%s: %v", n.name, err)
			}
		}
	}
	expect(canary, general)
	if logs := canary.agent.Logs(); !strings.Contains(logs, "override 0 (pool=canary) applies on node "+canary.name) {
		t.Errorf("the canary agent does not log its override:\n%s", canary.agent.LogTail(30))
	}

	relabel := func(n *node, pool string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{"pool":%q}}}`, pool)
		if _, err := c.admin.CoreV1().Nodes().Patch(t.Context(), n.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("label node %s pool=%s: %v", n.name, pool, err)
		}
	}
	relabel(canary, "general")
	relabel(general, "canary")
	expect(general, canary)

	for n, pid := range restarts {
		if n.agent.PID() != pid || n.agent.Exited() != nil {
			t.Errorf("%s: the agent restarted or exited (%v)", n.name, n.agent.Exited())
		}
	}
}
