package agenttest

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// IptablesSave returns `iptables-save -t table` (family "ipv4") or `ip6tables-save -t table` ("ipv6")
// run inside netns, without comment lines and counters, so that outputs compare across calls. The
// iptables variant is the system default (iptables-nft on Debian 12) unless variant is "legacy" or
// "nft".
func IptablesSave(ctx context.Context, netns, variant, family, table string) (string, error) {
	bin := "iptables"
	if family == "ipv6" {
		bin = "ip6tables"
	}
	if variant == "legacy" || variant == "nft" {
		bin += "-" + variant
	}
	out, err := InNetns(ctx, netns, bin+"-save", "-t", table)
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
func NftList(ctx context.Context, netns string) (string, error) {
	return InNetns(ctx, netns, "nft", "list", "ruleset")
}

// NftListTable returns `nft list table <family> <name>` inside netns; a missing table gives ("", nil).
func NftListTable(ctx context.Context, netns, family, name string) (string, error) {
	out, err := InNetns(ctx, netns, "nft", "list", "table", family, name)
	if err != nil && (strings.Contains(out, "No such file or directory") || strings.Contains(err.Error(), "No such file or directory")) {
		return "", nil
	}
	return out, err
}

// InNetns runs a command inside netns with `ip netns exec` and returns its combined output; an error
// names the command and carries the output.
func InNetns(ctx context.Context, netns string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (netns %s): %w: %s", strings.Join(args, " "), netns, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
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
