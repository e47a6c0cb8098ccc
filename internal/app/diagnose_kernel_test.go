package app

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/testing/ctfill"
)

// TestDiagnoseHelperProcess is the child of TestDiagnoseChangesNothing: `diagnose` in text and in
// JSON, every setting on auto, inside the test's network namespace.
func TestDiagnoseHelperProcess(t *testing.T) {
	netns.Child(t, "TestDiagnoseChangesNothing")
	for _, args := range [][]string{{"diagnose"}, {"diagnose", "--output", "json", "--proxy-mode", "iptables"}, {"diagnose", "--proxy-mode", "nftables"}} {
		out, err := runCmd(t, args...)
		var exit *ExitError
		if err != nil && !(errors.As(err, &exit) && exit.Code == diagnose.ExitProblem) {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		fmt.Printf("%v:\n%s", args, out) // the parent reads it

	}
}

var (
	ctTimeoutRE = regexp.MustCompile(`^(\S+\s+\d+\s+)\d+ `)
	// Packet counts of chain policies move with diagnose's own probe of 127.0.0.1:10249; the
	// comment lines carry the time.
	policyCountsRE = regexp.MustCompile(`(?m)^(:\S+ \S+) \[\d+:\d+\]$`)
	saveCommentRE  = regexp.MustCompile(`(?m)^#.*$`)
)

// TestDiagnoseChangesNothing: `diagnose` only reads. In a namespace holding legacy iptables rules,
// an nftables ruleset and conntrack entries, the legacy and nftables rulesets, the kernel's lists
// of legacy tables, the sysctls the checks read and the conntrack table are the same after it ran
// (in text and JSON, kube-proxy's mode detected, iptables and nftables).
func TestDiagnoseChangesNothing(t *testing.T) {
	netns.Require(t, "nft", "iptables-legacy-save", "ip6tables-legacy-save", "iptables-legacy", "iptables-nft", "conntrack")
	ns := netns.New(t, "nnm-diag")
	ns.MustExec("iptables-legacy", "-t", "filter", "-N", "KUBE-FORWARD")
	ns.MustExec("iptables-legacy", "-t", "filter", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	ns.NftLoad(`table ip kube-proxy {
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 192.0.2.10 . tcp . 80 : drop }
	}
	chain forward {
		type filter hook forward priority -110;
		ct state invalid drop
	}
}`)
	if err := ns.Do(func() error {
		return ctfill.Create(3, func(i int) ctfill.Entry {
			return ctfill.Entry{Protocol: syscall.IPPROTO_UDP, Src: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.50"), uint16(40000+i)),
				Dst: netip.MustParseAddrPort("192.0.2.1:8125"), DNATTo: netip.MustParseAddrPort("10.244.1.9:8125")}
		})
	}); err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[string]string {
		out := map[string]string{}
		for name, cmd := range map[string][]string{
			"iptables-legacy-save":       {"iptables-legacy-save"},
			"ip6tables-legacy-save":      {"ip6tables-legacy-save"},
			"iptables-nft-save":          {"iptables-nft-save"},
			"nft list ruleset":           {"nft", "list", "ruleset"},
			"/proc/net/ip_tables_names":  {"cat", "/proc/net/ip_tables_names"},
			"/proc/net/ip6_tables_names": {"cat", "/proc/net/ip6_tables_names"},
			"sysctls": {"sysctl", "net.netfilter.nf_conntrack_tcp_be_liberal", "net.netfilter.nf_conntrack_max",
				"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.lo.rp_filter", "net.ipv4.conf.all.route_localnet"},
			"conntrack -L": {"conntrack", "-L"},
		} {
			got, err := ns.Exec(cmd...)
			if err != nil {
				got = "error: " + err.Error() // a names file is absent until a table exists
			}
			got = saveCommentRE.ReplaceAllString(policyCountsRE.ReplaceAllString(got, "$1"), "")
			if name == "conntrack -L" { // the timeouts count down
				lines := strings.Split(strings.TrimSpace(got), "\n")
				for i, l := range lines {
					lines[i] = ctTimeoutRE.ReplaceAllString(l, "$1")
				}
				sort.Strings(lines)
				got = strings.Join(lines, "\n")
			}
			out[name] = got
		}
		return out
	}
	before := snapshot()
	if !strings.Contains(before["conntrack -L"], "10.244.1.9") {
		t.Fatalf("the conntrack entries were not created:\n%s", before["conntrack -L"])
	}
	out, errOut, err := ns.RunChild("TestDiagnoseHelperProcess")
	if err != nil {
		t.Fatalf("diagnose in %s: %v\n%s%s", ns.Name, err, out, errOut)
	}
	after := snapshot()
	for name, b := range before {
		if after[name] != b {
			t.Errorf("%s changed by diagnose:\nbefore: %q\nafter:  %q", name, b, after[name])
		}
	}
	if !strings.Contains(string(out), "nft-no-endpoint-drop PROBLEM") {
		t.Errorf("diagnose --proxy-mode nftables did not name kube-proxy's drop:\n%s", out)
	}
}
