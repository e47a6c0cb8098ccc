package dataplane

// A good neighbour (issue #20): beside an agent that keeps its own jumps at position 1 of the
// built-in chains (internal/testing/insertfirst, Calico's Felix in its default insert mode), our agent at
// syncPeriod 2s counts no repair, neither side moves a jump once both are in, and the connection-reset
// reproduction still sees no RST, although the neighbour's filter INPUT chain ACCEPTs everything
// ahead of anything of ours in filter.
//
// The measurement of issue #20 (backends/iptables/README.md, "Position among other agents"):
//
//	NNM_REQUIRE_KERNEL=1 NNM_NEIGHBOUR_WINDOW=10m go test -count=1 -v -timeout 20m -run TestInsertFirstNeighbour ./dataplane/
//
// with NNM_NEIGHBOUR_NO_APISERVER=1 where no kube-apiserver is built (invalid-drop alone), and
// NNM_AGENT_BIN pointing at another build to compare.

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/insertfirst"
	"github.com/network-node-manager/network-node-manager/internal/testing/resettest"
)

// chainCounters are the packet and byte counters of a chain declaration in iptables-save.
var chainCounters = regexp.MustCompile(`\[\d+:\d+\]`)

// neighbourWindow is how long both agents run side by side after they settled: 20 s in make test;
// NNM_NEIGHBOUR_WINDOW (a Go duration) makes it longer for a measurement (BENCHMARKS-style runs
// outside make test, e.g. 10m).
func neighbourWindow(t *testing.T) time.Duration {
	v := os.Getenv("NNM_NEIGHBOUR_WINDOW")
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second {
		t.Fatalf("NNM_NEIGHBOUR_WINDOW=%q: want a Go duration of at least 10s (%v)", v, err)
	}
	return d
}

func TestInsertFirstNeighbour(t *testing.T) {
	t.Parallel() // mostly waits out the observation window; runs beside TestConnectionResetBesideKubeProxy
	require(t, "nft", "conntrack", "sysctl", "iptables-nft", "ip6tables-nft")
	neighbourWindow := neighbourWindow(t)
	tp := resettest.New(t)
	// NNM_NEIGHBOUR_NO_APISERVER=1 (a measurement on a machine without kube-apiserver) runs
	// invalid-drop alone: ipvs-externalip-dnat programs nothing before it has listed Services.
	api := os.Getenv("NNM_NEIGHBOUR_NO_APISERVER") != "1"
	apiArgs := []string{"--disable-fix", "ipvs-externalip-dnat"}
	if api {
		cp := controlPlane(t)
		kubeconfig, err := cp.ConnectNamespace(tp.Node.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.DisconnectNamespace(tp.Node.Name) })
		apiArgs = []string{"--kubeconfig", kubeconfig, "--node-name", tp.Node.Name}
	}

	// The neighbour is there first, as a CNI agent is on a node the agent is rolled out to.
	const period = 2 * time.Second
	nb, err := insertfirst.Start(t.Context(), insertfirst.Options{Netns: tp.Node.Name, Variant: "nft",
		Binaries: []string{"iptables", "ip6tables"}, Jumps: insertfirst.Calico, Period: period})
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Stop()

	var cidrs []string
	for _, p := range resettest.Plans {
		cidrs = append(cidrs, p.PodCIDR.String())
	}
	agent := agenttest.StartT(t, agenttest.Options{Netns: tp.Node.Name, Args: append([]string{
		"--backend", "iptables", "--iptables-variant", "nft", "--proxy-mode", "ipvs",
		"--pod-cidrs", strings.Join(cidrs, ","),
		"--sync-period", period.String(), "--log-level", "debug",
	}, apiArgs...)})
	agent.WaitReadyT(t, 30*time.Second)

	saves := func() string {
		var b strings.Builder
		for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
			for _, l := range strings.Split(tp.Node.MustExec(bin), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					b.WriteString(chainCounters.ReplaceAllString(l, "[0:0]") + "\n")
				}
			}
		}
		return b.String()
	}
	ours := []string{`-A INPUT -m comment --comment "network-node-manager:invalid-drop" -j NNM-INVALID-INPUT`}
	if api {
		ours = append(ours,
			`-A PREROUTING -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-PREROUTING`,
			`-A OUTPUT -m comment --comment "network-node-manager:ipvs-externalip-dnat" -j NNM-EXTIP-OUTPUT`)
	}
	// Settled: our jumps are in (both fixes, both families) and the neighbour ran two rounds since.
	agenttest.Eventually(t, 30*time.Second, func() error {
		s := saves()
		for _, l := range ours {
			if n := strings.Count(s, l); n != 2 {
				return fmt.Errorf("%d of %q, want one per family", n, l)
			}
		}
		return nil
	})
	_, rounds0 := nb.Reinserts()
	agenttest.Eventually(t, 3*period+5*time.Second, func() error {
		if _, r := nb.Reinserts(); r < rounds0+2 {
			return fmt.Errorf("neighbour rounds %d, want ≥ %d", r, rounds0+2)
		}
		return nil
	})

	m0 := agent.MetricsT(t)
	moves0, rounds0 := nb.Reinserts()
	before := saves()
	select {
	case <-time.After(neighbourWindow):
	case <-t.Context().Done():
		t.Fatal("test deadline")
	}
	m1 := agent.MetricsT(t)
	moves1, rounds1 := nb.Reinserts()
	after := saves()

	repairs := m1.Sum("nnm_sync_repairs_total")
	syncs := m1.Sum("nnm_syncs_total", "fix", "invalid-drop") - m0.Sum("nnm_syncs_total", "fix", "invalid-drop")
	t.Logf("before the window: the neighbour moved its jumps %d times (its start not counted); in %v: invalid-drop's syncs +%v, our repairs %v in all, the neighbour's moves +%d in %d rounds",
		moves0, neighbourWindow, syncs, repairs, moves1-moves0, rounds1-rounds0)
	t.Logf("nnm_sync_repairs_total per fix and family: %q", m1.Lines("nnm_sync_repairs_total"))
	if repairs != 0 {
		t.Errorf("nnm_sync_repairs_total = %v beside an insert-first neighbour; want 0:\n%s", repairs, m1.Lines("nnm_sync_repairs_total"))
	}
	if moves1 != moves0 || rounds1-rounds0 < int(neighbourWindow/period)-2 {
		t.Errorf("the neighbour moved its jumps %d times in %d rounds during the window; want 0 in ≥ %d", moves1-moves0, rounds1-rounds0, int(neighbourWindow/period)-2)
	}
	// Each fix and family resyncs every period: the window saw real resyncs, not a stalled agent.
	if min := float64(2 * (int(neighbourWindow/period) - 2)); syncs < min {
		t.Errorf("invalid-drop's syncs +%v in the window; want ≥ %v (two families)", syncs, min)
	}
	if after != before {
		t.Errorf("the rulesets moved during the window:\n%s", cmp.Diff(strings.Split(before, "\n"), strings.Split(after, "\n")))
	}
	for _, j := range insertfirst.Calico {
		want := 0 // the same rule text in another table (PREROUTING -j cali-PREROUTING: mangle and nat)
		for _, k := range insertfirst.Calico {
			if k.Chain == j.Chain && k.Target == j.Target {
				want += 2
			}
		}
		if n := strings.Count(after, "-A "+j.Chain+" -j "+j.Target+"\n"); n != want {
			t.Errorf("%d of the neighbour's %s %s jump, want %d (one per family and table)", n, j.Table, j.Chain, want)
		}
	}
	for _, l := range ours {
		if n := strings.Count(after, l); n != 2 {
			t.Errorf("%d of %q, want one per family", n, l)
		}
	}
	var builtin []string
	for _, c := range []string{"-A PREROUTING ", "-A INPUT ", "-A OUTPUT "} {
		builtin = append(builtin, agenttest.Lines(after, c)...)
	}
	t.Logf("jumps in the built-in chains after the window (IPv4 then IPv6, tables in iptables-save order per chain):\n%s", strings.Join(builtin, "\n"))

	// The reproduction with the neighbour's chains in place: cali-INPUT ACCEPTs everything in filter
	// INPUT, before anything of ours could there; the drop in mangle INPUT comes first anyway.
	for _, p := range resettest.Plans {
		in := resettest.Inject(t, tp, p, false)
		t.Logf("%s beside the neighbour: %s", p.Family, in)
		if err := in.Prevented(); err != nil {
			t.Fatal(err)
		}
	}
	if err := nb.Stop(); err != nil {
		t.Fatal(err)
	}
}
