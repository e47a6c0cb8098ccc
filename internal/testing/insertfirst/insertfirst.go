// Package insertfirst is a small neighbour for tests: an agent that, like Calico's Felix in its
// default ChainInsertMode "insert", keeps a jump of its own at position 1 of built-in chains. Every
// Period it lists each of those chains; when its jump is missing or not the first rule, it deletes it
// and inserts it at the top again, and counts that as a re-insert (Felix logs "Detected out-of-sync
// inserts, marking for resync"). An agent that insists on position 1 as well moves its own jump back
// each time, and the two never settle: that is what issue #20 measured, and what the tests that run
// this neighbour beside ours show is gone.
//
// It runs the iptables binaries of one variant inside a network namespace of the test (never the
// host's), one process per command, as Felix's non-restore paths do; its chains are declared once at
// Start with their rules.
package insertfirst

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// Jump is one rule the agent keeps first in a built-in chain: "-j Target" from Table/Chain, where
// Target is a chain of its own holding Rules (iptables rule specs without "-A Target").
type Jump struct {
	Table, Chain, Target string
	Rules                []string
}

// Calico is a Felix-like layout: cali- chains hooked first into filter INPUT, mangle PREROUTING and
// nat PREROUTING and OUTPUT. cali-INPUT ACCEPTs everything (a host endpoint policy that allows all:
// the worst case for a drop behind it in the same table); the others only ACCEPT established flows
// or hold nothing, as Felix's do without floating IPs.
var Calico = []Jump{
	{Table: "filter", Chain: "INPUT", Target: "cali-INPUT", Rules: []string{"-m comment --comment cali:host-policy-allows-all -j ACCEPT"}},
	{Table: "mangle", Chain: "PREROUTING", Target: "cali-PREROUTING", Rules: []string{"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"}},
	{Table: "nat", Chain: "PREROUTING", Target: "cali-PREROUTING", Rules: []string{"-j cali-fip-dnat"}},
	{Table: "nat", Chain: "OUTPUT", Target: "cali-OUTPUT", Rules: []string{"-j cali-fip-dnat"}},
}

// fipChain is the empty floating-IP chain the nat jumps of Calico go through.
const fipChain = "cali-fip-dnat"

// Options configure an Agent.
type Options struct {
	Netns    string   // the test's namespace
	Variant  string   // "nft" or "legacy"
	Binaries []string // iptables binaries without variant: "iptables", "ip6tables"
	Jumps    []Jump
	Period   time.Duration
}

// Agent is a running insert-first neighbour.
type Agent struct {
	opts   Options
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	reinserts int
	rounds    int
	err       error
}

// Start declares the agent's chains, inserts its jumps at position 1 and keeps them there until
// Stop.
func Start(ctx context.Context, opts Options) (*Agent, error) {
	a := &Agent{opts: opts, done: make(chan struct{})}
	for _, bin := range opts.Binaries {
		if err := a.declare(ctx, bin); err != nil {
			return nil, err
		}
	}
	if _, err := a.round(ctx); err != nil {
		return nil, err
	}
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	go a.loop(ctx)
	return a, nil
}

func (a *Agent) bin(b string) string { return b + "-" + a.opts.Variant }

func (a *Agent) ipt(ctx context.Context, bin string, args ...string) (string, error) {
	return netns.Exec(ctx, a.opts.Netns, append([]string{a.bin(bin), "-w", "5"}, args...)...)
}

func (a *Agent) declare(ctx context.Context, bin string) error {
	declared := map[string]bool{}
	for _, j := range a.opts.Jumps {
		for _, c := range []string{j.Target, fipChain} {
			if declared[j.Table+"/"+c] || (c == fipChain && j.Table != "nat") {
				continue
			}
			declared[j.Table+"/"+c] = true
			if _, err := a.ipt(ctx, bin, "-t", j.Table, "-N", c); err != nil {
				return fmt.Errorf("insert-first agent: %w", err)
			}
		}
		for _, r := range j.Rules {
			if _, err := a.ipt(ctx, bin, append([]string{"-t", j.Table, "-A", j.Target}, strings.Fields(r)...)...); err != nil {
				return fmt.Errorf("insert-first agent: %w", err)
			}
		}
	}
	return nil
}

// jumpRule is the agent's rule in a built-in chain, as iptables -S prints it.
func jumpRule(j Jump) string { return "-A " + j.Chain + " -j " + j.Target }

// round checks every jump once and moves those that are not first; it returns how many it moved.
func (a *Agent) round(ctx context.Context) (int, error) {
	moved := 0
	for _, bin := range a.opts.Binaries {
		for _, j := range a.opts.Jumps {
			out, err := a.ipt(ctx, bin, "-t", j.Table, "-S", j.Chain)
			if err != nil {
				return moved, err
			}
			var rules []string
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "-A ") {
					rules = append(rules, strings.TrimSpace(l))
				}
			}
			if len(rules) > 0 && rules[0] == jumpRule(j) {
				continue
			}
			for _, r := range rules {
				if r == jumpRule(j) {
					if _, err := a.ipt(ctx, bin, "-t", j.Table, "-D", j.Chain, "-j", j.Target); err != nil {
						return moved, err
					}
				}
			}
			if _, err := a.ipt(ctx, bin, "-t", j.Table, "-I", j.Chain, "1", "-j", j.Target); err != nil {
				return moved, err
			}
			moved++
		}
	}
	return moved, nil
}

func (a *Agent) loop(ctx context.Context) {
	defer close(a.done)
	tick := time.NewTicker(a.opts.Period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := a.round(ctx)
		a.mu.Lock()
		a.rounds++
		a.reinserts += n
		if err != nil && ctx.Err() == nil && a.err == nil {
			a.err = err
		}
		a.mu.Unlock()
	}
}

// Reinserts is how many times the agent found one of its jumps out of place (or gone) and put it
// back at the top since Start (the inserts of Start itself not counted), and how many rounds it ran.
func (a *Agent) Reinserts() (reinserts, rounds int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reinserts, a.rounds
}

// Stop ends the loop and returns its first error. The agent's chains stay (the namespace goes with
// the test).
func (a *Agent) Stop() error {
	a.cancel()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}
