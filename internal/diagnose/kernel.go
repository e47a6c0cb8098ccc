package diagnose

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/detect"
)

// Link is a network interface.
type Link struct {
	Name string
	MTU  int
	Up   bool
}

// Route is one route of the main table: where packets to Dst leave (Dev).
type Route struct {
	Family rules.Family
	Dst    netip.Prefix
	Dev    string
}

// Kernel is what the checks read from the node's network namespace besides conntrack and sysctls.
type Kernel interface {
	Links() ([]Link, error)
	Routes() ([]Route, error)
	// Neighbours counts the neighbour (ARP, NDP) entries per family.
	Neighbours() (map[rules.Family]int, error)
	// InterfaceSysctl reads net.<ipv4|ipv6>.conf.<dev>.<name> (dev may hold dots).
	InterfaceSysctl(family rules.Family, dev, name string) (string, error)
	// IptablesSave is `<iptables|ip6tables>-<variant>-save -c -t <table>`; a table that the legacy
	// variant does not list is empty (naming it would create it: detect.IptablesSaveCounters).
	IptablesSave(ctx context.Context, variant string, family rules.Family, table string) (string, error)
	// NftList is `nft list <args>` (e.g. "map", "ip", "kube-proxy", "no-endpoint-services").
	NftList(ctx context.Context, args ...string) (string, error)
}

// RealKernel reads the network namespace of the calling thread.
type RealKernel struct {
	// ProcSys is the sysctl tree (default /proc/sys).
	ProcSys string
}

var _ Kernel = RealKernel{}

// procNet is the namespace's /proc/net of the calling thread: /proc/net follows the process's main
// thread, thread-self follows a thread that entered another namespace.
func procNet(name string) string {
	if _, err := os.Stat("/proc/thread-self/net"); err == nil {
		return filepath.Join("/proc/thread-self/net", name)
	}
	return filepath.Join("/proc/net", name)
}

// Links implements Kernel.
func (RealKernel) Links() ([]Link, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []Link
	for _, i := range ifs {
		out = append(out, Link{Name: i.Name, MTU: i.MTU, Up: i.Flags&net.FlagUp != 0})
	}
	return out, nil
}

// Routes implements Kernel: /proc/net/route and /proc/net/ipv6_route (the main table).
func (RealKernel) Routes() ([]Route, error) {
	var out []Route
	v4, err := os.ReadFile(procNet("route"))
	if err != nil {
		return nil, err
	}
	out = append(out, parseRoute4(string(v4))...)
	if v6, err := os.ReadFile(procNet("ipv6_route")); err == nil {
		out = append(out, parseRoute6(string(v6))...)
	}
	return out, nil
}

// parseRoute4 reads /proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask …, the
// addresses in host byte order (little-endian on the architectures the agent is built for).
func parseRoute4(text string) []Route {
	var out []Route
	for i, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 8 {
			continue
		}
		dst, err1 := hex.DecodeString(f[1])
		mask, err2 := hex.DecodeString(f[7])
		if err1 != nil || err2 != nil || len(dst) != 4 || len(mask) != 4 {
			continue
		}
		// The hex is the network-order address read as a little-endian integer: reversed bytes.
		a := [4]byte{dst[3], dst[2], dst[1], dst[0]}
		bits := 0
		for mm := binary.BigEndian.Uint32([]byte{mask[3], mask[2], mask[1], mask[0]}); mm&(1<<31) != 0; mm <<= 1 {
			bits++
		}
		out = append(out, Route{Family: rules.IPv4, Dst: netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked(), Dev: f[0]})
	}
	return out
}

// parseRoute6 reads /proc/net/ipv6_route: dst dstlen src srclen nexthop metric refcnt use flags dev.
func parseRoute6(text string) []Route {
	var out []Route
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[9] == "lo" {
			continue
		}
		b, err := hex.DecodeString(f[0])
		bits, err2 := strconv.ParseInt(f[1], 16, 32)
		if err != nil || err2 != nil || len(b) != 16 {
			continue
		}
		a := netip.AddrFrom16([16]byte(b))
		if a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue
		}
		out = append(out, Route{Family: rules.IPv6, Dst: netip.PrefixFrom(a, int(bits)).Masked(), Dev: f[9]})
	}
	return out
}

// Neighbours implements Kernel with one RTM_GETNEIGH dump (the entries are counted, not kept).
func (RealKernel) Neighbours() (map[rules.Family]int, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink: %w", err)
	}
	defer c.Close()
	req := netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETNEIGH, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofNdMsg), // family AF_UNSPEC: every family
	}
	msgs, err := c.Execute(req)
	if err != nil {
		return nil, fmt.Errorf("dump the neighbour tables: %w", err)
	}
	out := map[rules.Family]int{rules.IPv4: 0, rules.IPv6: 0}
	for _, m := range msgs {
		if len(m.Data) < unix.SizeofNdMsg {
			continue
		}
		switch m.Data[0] {
		case unix.AF_INET:
			out[rules.IPv4]++
		case unix.AF_INET6:
			out[rules.IPv6]++
		}
	}
	return out, nil
}

func procSysFamily(f rules.Family) string {
	if f == rules.IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// InterfaceSysctl implements Kernel.
func (k RealKernel) InterfaceSysctl(family rules.Family, dev, name string) (string, error) {
	if dev == "" || strings.ContainsAny(dev, "/ ") || dev == ".." || strings.Contains(name, "/") {
		return "", fmt.Errorf("invalid interface %q", dev)
	}
	root := k.ProcSys
	if root == "" {
		root = "/proc/sys"
	}
	b, err := os.ReadFile(filepath.Join(root, "net", procSysFamily(family), "conf", dev, name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// commandTimeout bounds each command a check runs.
const commandTimeout = 10 * time.Second

func runCommand(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), firstLine(msg))
	}
	return string(out), nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// IptablesSave implements Kernel.
func (RealKernel) IptablesSave(ctx context.Context, variant string, family rules.Family, table string) (string, error) {
	if variant != "nft" && variant != "legacy" {
		return "", fmt.Errorf("unknown iptables variant %q", variant)
	}
	return detect.IptablesSaveCounters(ctx, variant, string(family), table)
}

// NftList implements Kernel.
func (RealKernel) NftList(ctx context.Context, args ...string) (string, error) {
	return runCommand(ctx, "nft", append([]string{"list"}, args...)...)
}

// readLines returns the lines of a file, nil when it cannot be read.
func readLines(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		out = append(out, s.Text())
	}
	return out, s.Err()
}

var errNoKernel = errors.New("no kernel reader")
