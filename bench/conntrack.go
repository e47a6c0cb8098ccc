package main

// bench -conntrack: the peak RSS of stale-udp-conntrack against a conntrack table of N entries
// (fixes/staleudpconntrack/README.md, "Memory"). The table is made in a network namespace of its
// own with internal/testing/ctfill (no packets): half UDP, half TCP, every entry DNATed (the old dump held
// all of them), 10% of them UDP entries to addresses of Pods that went away. A child process, in
// that namespace, with the DaemonSet's environment (GOMEMLIMIT), runs the fix as the engine does (a
// first pass that sees the Pods, then passes without the gone ones while Result.More says so) and
// reports its VmHWM from /proc/self/status. -conntrack-old runs the dump that main had before
// issue 19 (ti-mo/conntrack DumpFilter, every DNAT entry of both protocols held) for comparison.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/prometheus/client_golang/prometheus"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/staleudpconntrack"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
)

// ctChildEnv makes the bench binary (or a test binary, see conntrack_test.go) the measured child.
const ctChildEnv = "NNM_BENCH_CONNTRACK_CHILD"

// Pods of the measured node: livePods addresses 10.244.1.1.. stay, gonePods after them go away.
const (
	livePods = 100
	gonePods = 100
)

func podAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 244, 1 + byte(i/250), byte(1 + i%250)})
}

// tableEntry is entry i of the table: every tenth a UDP entry to a gone Pod; the others alternate
// TCP and UDP, to live Pods of this node and to pods of another node (10.244.9.x).
func tableEntry(i int) ctfill.Entry {
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, byte(i / 60000), 1}), uint16(1024+i%60000))
	dst := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.1"), 8125)
	e := ctfill.Entry{Protocol: ctfill.UDP, Src: src, Dst: dst}
	switch {
	case i%10 == 0:
		e.DNATTo = netip.AddrPortFrom(podAddr(livePods+i/10%gonePods), 8125)
	case i%2 == 1:
		e.Protocol, e.DNATTo = ctfill.TCP, netip.AddrPortFrom(podAddr(i%livePods), 8125)
	default:
		e.DNATTo = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 9, byte(1 + i%250)}), 8125)
	}
	return e
}

type ctResult struct {
	N, Stale, Deleted, Passes int
	Old                       bool
	Took                      time.Duration
	HWM, RSS                  int64 // kB, as /proc/PID/status says
	LeftStale, LiveUDPLeft    int
}

// measureConntrack fills a fresh namespace with n entries and runs the child in it.
func measureConntrack(ctx context.Context, n int, env []string, old bool) (*ctResult, error) {
	name := fmt.Sprintf("nnm-ctmem-%d-%d", os.Getpid(), n)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	t0 := time.Now()
	if err := netns.Do("/run/netns/"+name, func() error { return ctfill.Create(n, tableEntry) }); err != nil {
		return nil, err
	}
	logf("conntrack: %d entries created in %v", n, time.Since(t0).Round(time.Millisecond))
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", name, self)
	cmd.Env = append(append(os.Environ(), env...), fmt.Sprintf("%s=%d,%v", ctChildEnv, n, old))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("child: %w", err)
	}
	var r ctResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("child said %q: %w", out, err)
	}
	return &r, nil
}

// conntrackChild is the measured process: it runs in the table's namespace and prints a ctResult.
func conntrackChild(spec string) error {
	var n int
	var old bool
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, ",", " "), "%d %t", &n, &old); err != nil {
		return fmt.Errorf("%s=%q: %w", ctChildEnv, spec, err)
	}
	r := ctResult{N: n, Old: old, Stale: (n + 9) / 10}
	ctx := context.Background()
	start := time.Now()
	if old {
		c, err := ct.Dial(nil)
		if err != nil {
			return err
		}
		var held [][]ct.Flow
		for _, fam := range []netfilter.ProtoFamily{netfilter.ProtoIPv4, netfilter.ProtoIPv6} {
			flows, err := c.DumpFilter(ct.NewFilter().Family(fam).Status(ct.StatusDstNAT).StatusMask(uint32(ct.StatusDstNAT)), nil)
			if err != nil {
				return err
			}
			held = append(held, flows)
		}
		r.Passes = len(held[0]) + len(held[1]) // entries held at once
		c.Close()
	} else {
		f, err := staleudpconntrack.New(fix.Params{Conntrack: nodestate.NewConntrack(), Registry: prometheus.NewRegistry(),
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		podsOf := func(k int) *fix.Snapshot {
			var out []*corev1.Pod
			for i := range k {
				out = append(out, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("p%d", i)},
					Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: podAddr(i).String()}}}})
			}
			snap := fix.NewSnapshot(fix.Env{}, nil)
			inputs.Pods.Set(snap, out)
			return snap
		}
		if _, err := f.Ensure(ctx, podsOf(livePods+gonePods), true); err != nil {
			return err
		}
		snap := podsOf(livePods)
		for more, full := true, false; more; full = false {
			res, err := f.Ensure(ctx, snap, full)
			if err != nil {
				return err
			}
			r.Passes++
			r.Deleted += res.Items
			more = res.More
		}
	}
	r.Took = time.Since(start)
	// What is left: stale entries (must be none) and UDP entries to live targets (must all be there).
	if err := nodestate.NewConntrack().EachDNAT(ctx, rules.IPv4, rules.UDP, func(e nodestate.ConntrackEntry) bool {
		if a := e.Reply.Src.Addr(); a.As4()[2] == 1 && int(a.As4()[3]) > livePods {
			r.LeftStale++
		} else {
			r.LiveUDPLeft++
		}
		return true
	}); err != nil {
		return err
	}
	var err error
	if r.HWM, r.RSS, err = memory(os.Getpid()); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// runConntrack measures every size and prints one line each.
func runConntrack(ctx context.Context, sizes []int, m *manifest, old bool) error {
	var env []string
	limit := int64(0)
	if m != nil {
		env, limit = m.env, m.limit.Value()
	}
	logf("conntrack: child environment %v, memory limit %d MiB", env, limit>>20)
	fmt.Println("| entries | stale | deleted | passes | took | peak RSS (VmHWM) | limit | stale left | live UDP left |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, n := range sizes {
		r, err := measureConntrack(ctx, n, env, old)
		if err != nil {
			return fmt.Errorf("conntrack at %d: %w", n, err)
		}
		what := fmt.Sprintf("%d", r.Deleted)
		if old {
			what = fmt.Sprintf("(old dump: %d entries held)", r.Passes)
		}
		fmt.Printf("| %d | %d | %s | %d | %v | %.1f MiB | %d MiB | %d | %d |\n", r.N, r.Stale, what, r.Passes,
			r.Took.Round(time.Millisecond), float64(r.HWM)/1024, limit>>20, r.LeftStale, r.LiveUDPLeft)
	}
	return nil
}
