package e2e

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// TestBackendSwitchWithTheAPIDown (#41 row 4): when the backend switched while the API server was
// unreachable, the old backend's External-IP rules were deleted as soon as invalid-drop synced,
// while their replacement waited for the watches (a 76 s gap). Now each fix's old objects go only
// once its replacement is in. The node's route to the API server is blackholed, the agent restarted
// with the other backend; sampled every 100 ms through the switch, 10 s with the API down and the
// reconnection, both fixes' chains and the Service's DNAT entry are always in one backend or the
// other (longest gap 0 samples); at the end only the new backend holds them.
func TestBackendSwitchWithTheAPIDown(t *testing.T) {
	eachBackend(t, func(t *testing.T, c *cluster, be string) {
		other := map[string]string{"iptables": "nftables", "nftables": "iptables"}[be]
		n, _, _, entries := startServing(t, c, be, 41, lbService("", "web"), "203.0.41.20")
		entry := entries[0]

		// Blackhole the node's route to the API server.
		kc, err := os.ReadFile(n.args[slices.Index(n.args, "--kubeconfig")+1])
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`server: https://\[?([0-9a-f.:]+?)\]?:\d+`).FindSubmatch(kc)
		if m == nil {
			t.Fatalf("no server in the kubeconfig:\n%s", kc)
		}
		api := string(m[1])
		n.ns.MustExec("ip", "route", "add", "blackhole", api)

		gaps := map[string]*gap{fixDrop: {}, fixExtIP: {}, "dnat entry": {}}
		stop := sampleEvery(100*time.Millisecond, func() {
			for _, f := range []string{fixDrop, fixExtIP} {
				e1, e2 := n.as(be).fixPresent(f, "ipv4"), n.as(other).fixPresent(f, "ipv4")
				gaps[f].sample(e1 == nil || e2 == nil, fmt.Sprintf("%v / %v", e1, e2))
			}
			var held bool
			for _, b := range []string{be, other} {
				got, err := n.as(b).dnatEntries("ipv4")
				held = held || (err == nil && slices.Contains(got, entry))
			}
			gaps["dnat entry"].sample(held, entry)
		})

		// The switch, with the API down: stop, start with the other backend (not ready: no watch).
		if err := n.agent.Stop(agenttest.StopGrace); err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(n.args)
		args[slices.Index(args, "--backend")+1] = other
		n.agent = agenttest.StartT(t, agenttest.Options{Netns: n.ns.Name, Args: args})
		// invalid-drop needs no API: its replacement comes, and then its old objects go.
		agenttest.Eventually(t, converge, func() error {
			if err := n.as(other).fixPresent(fixDrop, "ipv4"); err != nil {
				return err
			}
			return n.as(be).fixAbsent(fixDrop, "ipv4")
		})
		time.Sleep(10 * time.Second)
		if err := n.as(be).fixPresent(fixExtIP, "ipv4"); err != nil {
			t.Errorf("%s → %s with the API down for 10 s: the old backend's External-IP rules are gone before their replacement: %v", be, other, err)
		}
		n.ns.MustExec("ip", "route", "del", "blackhole", api)
		took := agenttest.Eventually(t, 90*time.Second, func() error {
			var errs []error
			for _, f := range []string{fixDrop, fixExtIP} {
				for _, fam := range []string{"ipv4", "ipv6"} {
					errs = append(errs, n.as(other).fixPresent(f, fam), n.as(be).fixAbsent(f, fam))
				}
			}
			if got, err := n.as(other).dnatEntries("ipv4"); err != nil || !slices.Contains(got, entry) {
				errs = append(errs, fmt.Errorf("%s lacks %s: %q %v", other, entry, got, err))
			}
			return errors.Join(errs...)
		})
		stop()
		for _, k := range []string{fixDrop, fixExtIP, "dnat entry"} {
			g := gaps[k]
			t.Logf("%s → %s, API down 10 s, back %v before the old backend was empty: %s: %d samples at 100 ms, %d without, longest gap %d samples",
				be, other, took.Round(time.Millisecond), k, g.samples, g.missing, g.longest)
			if g.longest > 0 {
				t.Errorf("%s → %s: %s missing from both backends for %d samples (longest run); first: %s", be, other, k, g.longest, g.first)
			}
		}
	})
}

// gap counts the samples without something and the longest run of them.
// sampleEvery calls f every period in the background until the returned stop is called, which
// waits for a call under way to end.
func sampleEvery(period time.Duration, f func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			f()
		}
	})
	return func() { close(done); wg.Wait() }
}

type gap struct {
	mu                             sync.Mutex
	samples, missing, run, longest int
	first                          string
}

func (g *gap) sample(present bool, what string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.samples++
	if present {
		g.run = 0
		return
	}
	g.missing++
	g.run++
	g.longest = max(g.longest, g.run)
	if g.first == "" {
		g.first = what
	}
}

// TestPredecessorDNATStaysUntilReplaced (#41 row 4, the predecessor's part): the takeover removed
// every NMANAGER_ chain as soon as the first fix (invalid-drop) synced, so with the API server
// unreachable the predecessor's External-IP DNAT went long before ours could come. Now its
// invalid-drop chain goes once our invalid-drop is in, and its DNAT chains stay while our
// ipvs-externalip-dnat waits for the API: sampled every 100 ms for 10 s after our invalid-drop
// synced, they are never missing.
func TestPredecessorDNATStaysUntilReplaced(t *testing.T) {
	requireAgent(t)
	const server = "127.0.0.1:6443" // nothing listens there in a new netns
	n := startNode(t, nil, "iptables", nodeOptions{kubeconfig: unreachableKubeconfig(t, server), noWait: true,
		args: []string{"--iptables-variant", "nft"}, setup: func(t *testing.T, ns *netns.NS) {
			for _, args := range [][]string{
				{"-t", "filter", "-N", "NMANAGER_DROP_INVALID_INPUT"},
				{"-t", "filter", "-A", "NMANAGER_DROP_INVALID_INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
				{"-t", "filter", "-I", "INPUT", "-j", "NMANAGER_DROP_INVALID_INPUT"},
				{"-t", "nat", "-N", "NMANAGER_PREROUTING"},
				{"-t", "nat", "-N", "NMANAGER_EX_CLUS_IP"},
				{"-t", "nat", "-A", "NMANAGER_EX_CLUS_IP", "-d", "203.0.41.30/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "10.96.0.30:80"},
				{"-t", "nat", "-A", "NMANAGER_PREROUTING", "-j", "NMANAGER_EX_CLUS_IP"},
				{"-t", "nat", "-I", "PREROUTING", "-j", "NMANAGER_PREROUTING"},
			} {
				ns.MustExec(append([]string{"iptables-nft"}, args...)...)
			}
		}})
	n.variant = "nft"
	agenttest.Eventually(t, converge, func() error {
		if err := n.fixPresent(fixDrop, "ipv4"); err != nil {
			return err
		}
		if out, _ := agenttest.IptablesSave(t.Context(), n.ns.Name, "nft", "ipv4", "filter"); strings.Contains(out, "NMANAGER_DROP_INVALID_INPUT") {
			return fmt.Errorf("the predecessor's invalid-drop chain is still there:\n%s", out)
		}
		return nil
	})
	var g gap
	for range 100 {
		out, err := agenttest.IptablesSave(t.Context(), n.ns.Name, "nft", "ipv4", "nat")
		g.sample(err == nil && strings.Contains(out, "-A NMANAGER_EX_CLUS_IP -d 203.0.41.30/32") &&
			strings.Contains(out, "-A PREROUTING -j NMANAGER_PREROUTING"), out)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the predecessor's DNAT with ours waiting for the API: %d samples at 100 ms, %d without it, longest gap %d", g.samples, g.missing, g.longest)
	if g.missing > 0 {
		t.Errorf("the predecessor's DNAT was removed before ours was in: missing in %d of %d samples; nat then:\n%s", g.missing, g.samples, g.first)
	}
}
