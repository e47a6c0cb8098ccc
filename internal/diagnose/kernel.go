package diagnose

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/fixes/neighbourtable"
	"github.com/network-node-manager/network-node-manager/internal/detect"
)

// Link is a network interface.
type Link struct {
	Name string
	MTU  int
	Up   bool
}

// Route is one route of the main table: where packets to Dst leave (Dev), and the route's own mtu
// attribute (`ip route ... mtu 1400`; 0 when it has none, and the link's MTU applies).
type Route struct {
	Family rules.Family
	Dst    netip.Prefix
	Dev    string
	MTU    int
}

// Kernel is what the checks read from the node's network namespace besides conntrack and sysctls.
type Kernel interface {
	Links() ([]Link, error)
	Routes() ([]Route, error)
	// NeighbourStats reads a family's neighbour table (ARP, NDP): its entries over every network
	// namespace (what the kernel holds against gc_thresh3) and table_fulls (neighbours it refused).
	// Only the initial network namespace has them: elsewhere the error wraps os.ErrNotExist.
	NeighbourStats(family rules.Family) (entries int, fulls uint64, err error)
	// Neighbours counts the neighbour entries of this network namespace per family (one dump).
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

// Routes implements Kernel: one RTM_GETROUTE dump of the main table (both families), with each
// route's mtu metric, which /proc/net/route does not show.
func (RealKernel) Routes() ([]Route, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink: %w", err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofRtMsg), // family AF_UNSPEC: every family
	})
	if err != nil {
		return nil, fmt.Errorf("dump the routes: %w", err)
	}
	names := map[int]string{}
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			names[i.Index] = i.Name
		}
	}
	var out []Route
	for _, m := range msgs {
		out = append(out, parseRouteMsg(m.Data, names)...)
	}
	return out, nil
}

// parseRouteMsg reads one RTM_NEWROUTE message: a unicast route of the main table, one Route per
// outgoing interface (a multipath route has several). Link-local and multicast IPv6 destinations
// are left out, as are routes through interfaces not in names.
func parseRouteMsg(b []byte, names map[int]string) []Route {
	if len(b) < unix.SizeofRtMsg {
		return nil
	}
	family, dstLen, table, typ := b[0], int(b[1]), uint32(b[4]), b[7]
	var fam rules.Family
	var dst netip.Addr
	switch family {
	case unix.AF_INET:
		fam, dst = rules.IPv4, netip.IPv4Unspecified()
	case unix.AF_INET6:
		fam, dst = rules.IPv6, netip.IPv6Unspecified()
	default:
		return nil
	}
	if typ != unix.RTN_UNICAST {
		return nil
	}
	ad, err := netlink.NewAttributeDecoder(b[unix.SizeofRtMsg:])
	if err != nil {
		return nil
	}
	var oifs []int
	mtu := 0
	for ad.Next() {
		switch ad.Type() {
		case unix.RTA_TABLE:
			table = ad.Uint32()
		case unix.RTA_DST:
			if a, ok := netip.AddrFromSlice(ad.Bytes()); ok {
				dst = a
			}
		case unix.RTA_OIF:
			oifs = append(oifs, int(int32(ad.Uint32())))
		case unix.RTA_MULTIPATH:
			nh := ad.Bytes()
			for len(nh) >= unix.SizeofRtNexthop {
				n := int(binary.NativeEndian.Uint16(nh[0:2]))
				oifs = append(oifs, int(int32(binary.NativeEndian.Uint32(nh[4:8]))))
				if n < unix.SizeofRtNexthop || n > len(nh) {
					break
				}
				nh = nh[(n+3)&^3:]
			}
		case unix.RTA_METRICS:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() == unix.RTAX_MTU {
						mtu = int(nad.Uint32())
					}
				}
				return nil
			})
		}
	}
	if ad.Err() != nil || table != unix.RT_TABLE_MAIN {
		return nil
	}
	if fam == rules.IPv6 && (dst.IsLinkLocalUnicast() || dst.IsMulticast()) {
		return nil
	}
	p, err := dst.Prefix(dstLen)
	if err != nil {
		return nil
	}
	var out []Route
	for _, i := range oifs {
		if name, ok := names[i]; ok && name != "lo" {
			out = append(out, Route{Family: fam, Dst: p, Dev: name, MTU: mtu})
		}
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

// NeighbourStats implements Kernel: neighbour-table's reader (/proc/net/stat/arp_cache, ndisc_cache).
func (RealKernel) NeighbourStats(family rules.Family) (int, uint64, error) {
	return neighbourtable.ReadStats(family)
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
