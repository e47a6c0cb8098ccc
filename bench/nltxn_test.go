package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

var (
	ipA = [4]byte{172, 31, 0, 1}
	ipB = [4]byte{172, 31, 0, 2}
	ipX = [4]byte{192, 0, 2, 1} // not tracked
)

var trackTest = newTracker(netip.MustParsePrefix("172.31.0.0/16"))

func encode(t *testing.T, f func(ae *netlink.AttributeEncoder)) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	f(ae)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ruleMsg is an NEWRULE/DELRULE body: a cmp with each of cmps and an immediate load of each of imms.
func ruleMsg(t *testing.T, table, chain string, cmps, imms [][4]byte) []byte {
	expr := func(ae *netlink.AttributeEncoder, name string, attr uint16, v [4]byte) {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
			ae.String(unix.NFTA_EXPR_NAME, name)
			ae.Nested(unix.NFTA_EXPR_DATA, func(ae *netlink.AttributeEncoder) error {
				ae.Uint32(1, 1) // a register
				ae.Nested(attr, func(ae *netlink.AttributeEncoder) error {
					ae.Bytes(unix.NFTA_DATA_VALUE, v[:])
					return nil
				})
				return nil
			})
			return nil
		})
	}
	body := encode(t, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, table)
		ae.String(unix.NFTA_RULE_CHAIN, chain)
		ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(ae *netlink.AttributeEncoder) error {
			for _, v := range cmps {
				expr(ae, "cmp", unix.NFTA_CMP_DATA, v)
			}
			for _, v := range imms {
				expr(ae, "immediate", unix.NFTA_IMMEDIATE_DATA, v)
			}
			return nil
		})
	})
	return append([]byte{unix.NFPROTO_IPV4, 0, 0, 0}, body...)
}

// elemMsg is a NEWSETELEM/DELSETELEM body with elements keyed ip . tcp . 80.
func elemMsg(t *testing.T, table, set string, ips ...[4]byte) []byte {
	body := encode(t, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
		ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *netlink.AttributeEncoder) error {
			for _, ip := range ips {
				ae.Nested(unix.NFTA_LIST_ELEM, func(ae *netlink.AttributeEncoder) error {
					ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *netlink.AttributeEncoder) error {
						ae.Bytes(unix.NFTA_DATA_VALUE, append(ip[:], 6, 0, 0, 0, 0, 80, 0, 0))
						return nil
					})
					return nil
				})
			}
			return nil
		})
	})
	return append([]byte{unix.NFPROTO_IPV4, 0, 0, 0}, body...)
}

// A chain rewritten in place nets nothing; a rule that appears nets +1, one that goes -1; rule
// constants count once per rule whether compared or loaded; untracked addresses and other tables
// and chains are apart.
func TestTxnNetRules(t *testing.T) {
	tx := txn{}
	tx.add(unix.NFT_MSG_DELRULE, ruleMsg(t, "nat", "KUBE-SERVICES", [][4]byte{ipA}, nil), trackTest)
	tx.add(unix.NFT_MSG_NEWRULE, ruleMsg(t, "nat", "KUBE-SERVICES", [][4]byte{ipA}, nil), trackTest)
	tx.add(unix.NFT_MSG_NEWRULE, ruleMsg(t, "nat", "KUBE-SERVICES", [][4]byte{ipB, ipX}, nil), trackTest)
	tx.add(unix.NFT_MSG_DELRULE, ruleMsg(t, "nat", "NNM-EXTIP-DNAT-3", [][4]byte{ipA}, [][4]byte{ipA}), trackTest)
	for _, c := range []struct {
		elem          bool
		table, prefix string
		ip            [4]byte
		want          int
	}{
		{false, "nat", "KUBE-SERVICES", ipA, 0},
		{false, "nat", "KUBE-SERVICES", ipB, 1},
		{false, "nat", "KUBE-SERVICES", ipX, 0},
		{false, "nat", "NNM-EXTIP-DNAT", ipA, -1},
		{false, "filter", "KUBE-SERVICES", ipB, 0},
		{true, "nat", "KUBE-SERVICES", ipB, 0},
	} {
		if got := tx.net(c.elem, c.table, c.prefix, c.ip); got != c.want {
			t.Errorf("net(%v, %s, %s, %v) = %d, want %d", c.elem, c.table, c.prefix, c.ip, got, c.want)
		}
	}
}

// Set elements count by the first four bytes of their key; a NEWGEN or a short message changes nothing.
func TestTxnNetElements(t *testing.T) {
	tx := txn{}
	tx.add(unix.NFT_MSG_NEWSETELEM, elemMsg(t, "kube-proxy", "service-ips", ipA, ipB), trackTest)
	tx.add(unix.NFT_MSG_DELSETELEM, elemMsg(t, "kube-proxy", "service-ips", ipB), trackTest)
	tx.add(unix.NFT_MSG_NEWGEN, elemMsg(t, "kube-proxy", "service-ips", ipB), trackTest)
	tx.add(unix.NFT_MSG_NEWSETELEM, []byte{2, 0}, trackTest)
	if got := tx.net(true, "kube-proxy", "service-ips", ipA); got != 1 {
		t.Errorf("ipA: %d, want 1", got)
	}
	if got := tx.net(true, "kube-proxy", "service-ips", ipB); got != 0 {
		t.Errorf("ipB: %d, want 0", got)
	}
	if got := tx.net(false, "kube-proxy", "service-ips", ipA); got != 0 {
		t.Errorf("ipA as a rule constant: %d, want 0", got)
	}
}

// A change's wants hold on the commit that carries that side's rule and on no other: kube-proxy's
// commit does not satisfy the agent's want, a rewrite satisfies neither, and an endpoint change
// waits for kube-proxy only.
func TestWantsFor(t *testing.T) {
	kp, _ := kubeProxyRules("nftables")
	ag := agentRules("nftables")
	lb := nthAddr(createBase, 7).As4()
	create := wantsFor("create", 7, kp, ag)
	if len(create) != 2 || create[0].side != "kube-proxy" || create[1].side != "agent" {
		t.Fatalf("create wants %+v", create)
	}
	kpTxn := txn{}
	kpTxn.add(unix.NFT_MSG_NEWSETELEM, elemMsg(t, "kube-proxy", "service-ips", lb), sbsTrack)
	agTxn := txn{}
	agTxn.add(unix.NFT_MSG_NEWSETELEM, elemMsg(t, nftTable, nftMap, lb), sbsTrack)
	if !create[0].met(kpTxn) || create[1].met(kpTxn) || create[0].met(agTxn) || !create[1].met(agTxn) {
		t.Errorf("create wants met wrongly: kube-proxy's commit %v/%v, agent's %v/%v", create[0].met(kpTxn), create[1].met(kpTxn), create[0].met(agTxn), create[1].met(agTxn))
	}
	del := wantsFor("delete", 7, kp, ag)
	if del[0].met(kpTxn) || del[1].met(agTxn) {
		t.Error("an add met a delete's want")
	}
	ep := wantsFor("endpoints", 7, kp, ag)
	if len(ep) != 1 || ep[0].side != "kube-proxy" || ep[0].ip != nthAddr(sbsEPMoved, 7) || ep[0].prefix != "service-" {
		t.Errorf("endpoint wants %+v, want kube-proxy's endpoint chain for %v only", ep, nthAddr(sbsEPMoved, 7))
	}
	ipt, _ := kubeProxyRules("iptables")
	if ipt.elem || ipt.table != "nat" || agentRules("iptables").prefix != "NNM-EXTIP-DNAT" {
		t.Errorf("iptables rules %+v / %+v", ipt, agentRules("iptables"))
	}
	if _, err := kubeProxyRules("ipvs"); err == nil {
		t.Error("ipvs mode accepted: the side-by-side benchmark has no rule to wait for there")
	}
	if !sbsTrack.has(nthAddr(sbsEPBase, 3).As4()) || sbsTrack.has(nthAddr(scaleBase, 3).As4()) || sbsTrack.maybe([]byte{172, 16, 0, 4}) || !sbsTrack.maybe([]byte{9, 10, 113, 0}) {
		t.Error("sbsTrack must take the change Services' addresses and leave the scale Services' out, also in its scan")
	}
}

// What the kernel really sends: an nft map element and an iptables-nft rule carrying a tracked
// address, a chain rewritten in place by iptables-nft-restore (nets 0), and the element's removal.
func TestKernelTxnWatcher(t *testing.T) {
	netns.RequireKernel(t, "nft", "iptables-nft-restore")
	ns := netns.New(t, "nnm-nltxn")
	w, err := newTxnWatcher(ns.Path(), trackTest)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ip := netip.AddrFrom4(ipA)
	next := func(what string, check func(txn) bool) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case e := <-w.events:
				if e.overflow || e.first.IsZero() || e.first.After(e.at) {
					t.Fatalf("%s: event %+v", what, e)
				}
				if check(e.txn) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: no commit seen", what)
			}
		}
	}
	ns.MustExec("nft", "add table ip kube-proxy; add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }")
	ns.MustExec("nft", "add element ip kube-proxy service-ips { "+ip.String()+" . tcp . 80 : accept }")
	next("element added", func(tx txn) bool { return tx.net(true, "kube-proxy", "service-ips", ipA) == 1 })
	rules := "*nat\n:NNM-EXTIP-DNAT - [0:0]\n-A NNM-EXTIP-DNAT -d " + ip.String() + "/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.96.0.1:80\nCOMMIT\n"
	restore := func() {
		t.Helper()
		if out, err := ns.Run(t.Context(), "iptables-nft-restore", []string{"--noflush"}, strings.NewReader(rules), nil); err != nil {
			t.Fatalf("iptables-nft-restore: %v: %s", err, out)
		}
	}
	restore()
	next("rule added", func(tx txn) bool { return tx.net(false, "nat", "NNM-EXTIP-DNAT", ipA) == 1 })
	restore()
	next("chain rewritten", func(tx txn) bool {
		if n := tx.net(false, "nat", "NNM-EXTIP-DNAT", ipA); n != 0 {
			t.Fatalf("a rewrite of the same rule nets %d", n)
		}
		return true
	})
	ns.MustExec("nft", "delete element ip kube-proxy service-ips { "+ip.String()+" . tcp . 80 }")
	next("element removed", func(tx txn) bool { return tx.net(true, "kube-proxy", "service-ips", ipA) == -1 })
}

// fakeWatcher is a genWatcher fed by the test.
func fakeWatcher() *genWatcher { return &genWatcher{events: make(chan genEvent, 16)} }

// settle returns once the last write is writeGap old and the last commit commitGap old; a commit
// announced meanwhile moves the end out.
func TestSettle(t *testing.T) {
	const commitGap, writeGap = 60 * time.Millisecond, 120 * time.Millisecond
	w := fakeWatcher()
	start := time.Now()
	q := quiet{write: start, commit: start.Add(-time.Hour)}
	if err := settle(t.Context(), w, &q, commitGap, writeGap, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < writeGap {
		t.Errorf("settled %v after the write, want ≥ %v", d, writeGap)
	}
	start = time.Now()
	q = quiet{write: start.Add(-time.Hour), commit: start}
	go func() {
		time.Sleep(40 * time.Millisecond)
		w.events <- genEvent{at: time.Now()}
	}()
	if err := settle(t.Context(), w, &q, commitGap, writeGap, time.Minute); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 40*time.Millisecond+commitGap {
		t.Errorf("settled %v after a commit 40 ms in, want ≥ %v", d, 40*time.Millisecond+commitGap)
	}
	if !q.commit.After(start) {
		t.Error("the commit announced while settling was not recorded")
	}
}

// waitWants times each want by the first commit after the write that carries it, skips commits
// announced before the write, fails naming what never came, and gives up a sample after a lost
// notification instead of failing.
func TestWaitWants(t *testing.T) {
	kp, _ := kubeProxyRules("iptables")
	ag := agentRules("iptables")
	lb := nthAddr(createBase, 3)
	rule := func(table, chain string) txn {
		tx := txn{}
		tx.add(unix.NFT_MSG_NEWRULE, ruleMsg(t, table, chain, [][4]byte{lb.As4()}, nil), sbsTrack)
		return tx
	}
	since := time.Now()
	w := fakeWatcher()
	w.events <- genEvent{first: since.Add(-time.Millisecond), at: since, txn: rule("nat", "KUBE-SERVICES")}
	w.events <- genEvent{first: since.Add(5 * time.Millisecond), at: since.Add(6 * time.Millisecond), txn: rule("nat", "NNM-EXTIP-DNAT-AC1F0000")}
	w.events <- genEvent{first: since.Add(9 * time.Millisecond), at: since.Add(9 * time.Millisecond), txn: txn{}}
	w.events <- genEvent{first: since.Add(20 * time.Millisecond), at: since.Add(21 * time.Millisecond), txn: rule("nat", "KUBE-SERVICES")}
	var seen time.Time
	at, lost, err := waitWants(t.Context(), w, since, time.Second, wantsFor("create", 3, kp, ag), &seen)
	if err != nil || lost {
		t.Fatalf("waitWants: %v (lost %v)", err, lost)
	}
	if at[0] != since.Add(20*time.Millisecond) || at[1] != since.Add(5*time.Millisecond) {
		t.Errorf("kube-proxy at +%v, agent at +%v; want +20ms and +5ms", at[0].Sub(since), at[1].Sub(since))
	}
	if seen != since.Add(21*time.Millisecond) {
		t.Errorf("last commit seen at +%v, want +21ms", seen.Sub(since))
	}

	w.events <- genEvent{first: since.Add(time.Millisecond), at: since.Add(time.Millisecond), txn: rule("nat", "KUBE-SERVICES")}
	_, _, err = waitWants(t.Context(), w, since, 50*time.Millisecond, wantsFor("create", 3, kp, ag), &seen)
	if err == nil || !strings.Contains(err.Error(), "agent's add of "+lb.String()) || strings.Contains(err.Error(), "kube-proxy's") {
		t.Errorf("a missing agent rule: %v", err)
	}
	w.events <- genEvent{overflow: true, at: since.Add(time.Millisecond)}
	if _, lost, err := waitWants(t.Context(), w, since, 50*time.Millisecond, wantsFor("delete", 3, kp, ag), &seen); err != nil || !lost {
		t.Errorf("after an overflow: lost %v, err %v; want the sample given up", lost, err)
	}
}
