package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

const (
	nftTable   = "nnm-ipvs-externalip-dnat" // nftables backend: table ip nnm-<fix>
	nftMap     = "svc"                      // ipvsexternalipdnat.MapName
	iptDNATPfx = "-A NNM-EXTIP-DNAT"        // iptables backend: chain NNM-<Chain.Name>, its dispatch nodes and lookup buckets NNM-EXTIP-DNAT-<suffix> (a bucket of one rule inlined into its node)
)

// kernel reads what a backend left in a namespace. Reads are never timed: the benchmark times the
// nf_tables commit notifications (genWatcher) and reads the kernel afterwards to see what a commit
// carried.
type kernel interface {
	// entries counts the (External-IP, port) entries programmed.
	entries(ctx context.Context, ns string) (int, error)
	// has reports whether the entry for ip (TCP port 80) is programmed.
	has(ctx context.Context, ns string, ip netip.Addr) (bool, error)
	// dump returns the kernel's rules of the fix in a form the restore tool takes back.
	dump(ctx context.Context, ns string) (string, error)
	// restore applies a dump with one process run inside the namespace at nsPath (the floor).
	restore(nsPath, file string) error
	// addOne adds one entry with one process run (the floor of a one-Service change).
	addOne(nsPath string, ip netip.Addr) error
}

func kernelFor(backend string) kernel {
	if backend == "nftables" {
		return nftKernel{}
	}
	return iptKernel{}
}

type nftKernel struct{}

func (nftKernel) entries(ctx context.Context, ns string) (int, error) {
	out, err := netns.Exec(ctx, ns, "nft", "--json", "list", "map", "ip", nftTable, nftMap)
	if err != nil {
		if strings.Contains(out, "No such file or directory") {
			return 0, nil
		}
		return 0, err
	}
	var doc struct {
		Nftables []struct {
			Map *struct {
				Elem []json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		return 0, err
	}
	for _, o := range doc.Nftables {
		if o.Map != nil {
			return len(o.Map.Elem), nil
		}
	}
	return 0, nil
}

func (nftKernel) has(ctx context.Context, ns string, ip netip.Addr) (bool, error) {
	out, err := netns.Exec(ctx, ns, "nft", "get", "element", "ip", nftTable, nftMap,
		fmt.Sprintf("{ %s . tcp . %d }", ip, svcPort))
	if err == nil {
		return true, nil
	}
	if strings.Contains(out, "No such file or directory") || strings.Contains(out, "element does not exist") {
		return false, nil
	}
	return false, err
}

func (nftKernel) dump(ctx context.Context, ns string) (string, error) {
	return netns.Exec(ctx, ns, "nft", "list", "table", "ip", nftTable)
}

func (nftKernel) restore(nsPath, file string) error {
	return runIn(nsPath, "nft", "-f", file)
}

func (nftKernel) addOne(nsPath string, ip netip.Addr) error {
	return runIn(nsPath, "nft", "add", "element", "ip", nftTable, nftMap,
		fmt.Sprintf("{ %s . tcp . %d : 10.96.0.1 . %d }", ip, svcPort, svcPort))
}

type iptKernel struct{}

func (iptKernel) save(ctx context.Context, ns string) (string, error) {
	return netns.Output(ctx, ns, "iptables-nft-save", "-t", "nat")
}

func (k iptKernel) entries(ctx context.Context, ns string) (int, error) {
	out, err := k.save(ctx, ns)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, iptDNATPfx) && strings.Contains(l, "-j DNAT") {
			n++
		}
	}
	return n, nil
}

func (k iptKernel) has(ctx context.Context, ns string, ip netip.Addr) (bool, error) {
	out, err := k.save(ctx, ns)
	if err != nil {
		return false, err
	}
	want := fmt.Sprintf(" -d %s/32 ", ip)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, iptDNATPfx) && strings.Contains(l, want) && strings.Contains(l, "-j DNAT") {
			return true, nil
		}
	}
	return false, nil
}

func (k iptKernel) dump(ctx context.Context, ns string) (string, error) {
	return k.save(ctx, ns)
}

func (iptKernel) restore(nsPath, file string) error {
	return runIn(nsPath, "iptables-nft-restore", "-w", "5", file)
}

func (iptKernel) addOne(nsPath string, ip netip.Addr) error {
	return netns.Do(nsPath, func() error {
		cmd := exec.Command("iptables-nft-restore", "-w", "5", "--noflush")
		cmd.Stdin = strings.NewReader(fmt.Sprintf("*nat\n"+
			"-A NNM-EXTIP-DNAT -d %[1]s/32 -p tcp -m tcp --dport %[2]d -j DNAT --to-destination 10.96.0.1:%[2]d\n"+
			"COMMIT\n", ip, svcPort))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-nft-restore --noflush: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}

// runIn runs a command in a namespace from a thread that entered it (no `ip netns exec` in the
// timed path: the agent runs its tools directly too).
func runIn(nsPath string, name string, args ...string) error {
	return netns.Do(nsPath, func() error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	})
}

// floor applies dump with one restore/nft -f into fresh namespaces, runs times, and returns the
// median time; and the median time of adding one more entry with one process (one `nft add
// element`, or one `iptables-restore --noflush` appending a DNAT rule) on top.
func floor(k kernel, dump string, runs int) (full, one time.Duration, err error) {
	dir, err := os.MkdirTemp("", "nnm-bench-floor-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "rules")
	if err := os.WriteFile(file, []byte(dump), 0o644); err != nil {
		return 0, 0, err
	}
	var times, ones []time.Duration
	for i := 0; i < runs; i++ {
		ns := fmt.Sprintf("nnmb-floor-%d", os.Getpid())
		_ = netns.Delete(context.Background(), ns)
		if err := netns.Create(context.Background(), ns); err != nil {
			return 0, 0, err
		}
		start := time.Now()
		err := k.restore(netns.Path(ns), file)
		d := time.Since(start)
		var d1 time.Duration
		if err == nil {
			start = time.Now()
			err = k.addOne(netns.Path(ns), netip.MustParseAddr("198.51.100.1"))
			d1 = time.Since(start)
		}
		_ = netns.Delete(context.Background(), ns)
		if err != nil {
			return 0, 0, err
		}
		times, ones = append(times, d), append(ones, d1)
	}
	return median(times), median(ones), nil
}

func median(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

var errTimeout = errors.New("timed out")

// waitCommit waits for the first nf_tables commit announced at or after since after which cond
// holds, and returns the time of the commit's notification. The time is an upper bound: commits
// queued before a check are drained and the latest is used, and so are commits announced while the
// check ran (the check may have seen their state). If no notification comes for a second the kernel
// is checked anyway (a lost notification); if that check succeeds with no commit announced, its end
// time is used.
func waitCommit(ctx context.Context, w *genWatcher, since time.Time, timeout time.Duration, cond func() (bool, error)) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// latest drains the queued commits and returns the latest at or after since (zero if none).
	latest := func() time.Time {
		var at time.Time
		for {
			select {
			case e := <-w.events:
				if !e.at.Before(since) {
					at = e.at
				}
			default:
				return at
			}
		}
	}
	for {
		var at time.Time
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-deadline.C:
			return time.Time{}, errTimeout
		case e := <-w.events:
			if e.at.Before(since) {
				continue
			}
			at = e.at
			if l := latest(); !l.IsZero() {
				at = l
			}
		case <-tick.C:
			at = latest()
		}
		ok, err := cond()
		if err != nil {
			return time.Time{}, err
		}
		if !ok {
			continue
		}
		if l := latest(); !l.IsZero() {
			at = l // announced while the check ran
		} else if at.IsZero() {
			at = time.Now() // no announcement at all: the check's end bounds the commit
		}
		return at, nil
	}
}
