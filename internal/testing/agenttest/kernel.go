package agenttest

import (
	"bufio"
	"context"
	"strings"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// IptablesSave returns `iptables-save -t table` (family "ipv4") or `ip6tables-save -t table` ("ipv6")
// run inside netns, without comment lines and counters, so that outputs compare across calls. The
// iptables variant is the system default (iptables-nft on Debian 12) unless variant is "legacy" or
// "nft". An empty table means every table.
func IptablesSave(ctx context.Context, nsName, variant, family, table string) (string, error) {
	bin := "iptables"
	if family == "ipv6" {
		bin = "ip6tables"
	}
	if variant == "legacy" || variant == "nft" {
		bin += "-" + variant
	}
	args := []string{bin + "-save"}
	if table != "" {
		args = append(args, "-t", table)
	}
	out, err := netns.Exec(ctx, nsName, args...)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, ":") { // ":CHAIN POLICY [packets:bytes]"
			if i := strings.LastIndex(line, " ["); i > 0 {
				line = line[:i]
			}
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String(), sc.Err()
}

// NftList returns `nft list ruleset` run inside netns (all families).
func NftList(ctx context.Context, nsName string) (string, error) {
	return netns.Exec(ctx, nsName, "nft", "list", "ruleset")
}

// NftFamily is nft's name of an address family ("ipv4" or "ipv6", as IptablesSave takes it): ip or ip6.
func NftFamily(family string) string {
	if family == "ipv6" {
		return "ip6"
	}
	return "ip"
}

// NftListTable returns `nft list table <family> <name>` inside netns; a missing table gives ("", nil).
func NftListTable(ctx context.Context, nsName, family, name string) (string, error) {
	out, err := netns.Exec(ctx, nsName, "nft", "list", "table", family, name)
	if err != nil && (strings.Contains(out, "No such file or directory") || strings.Contains(err.Error(), "No such file or directory")) {
		return "", nil
	}
	return out, err
}

// Lines returns the lines of text that contain every one of the given substrings.
func Lines(text string, substrings ...string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		ok := line != ""
		for _, s := range substrings {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}
