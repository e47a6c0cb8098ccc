package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

var (
	// hostLinkRange holds the /30s linking the root netns and a control plane.
	hostLinkRange = netip.MustParsePrefix("198.19.0.0/16")
	// nodeLinkRange holds the /30s linking a control plane and node netns.
	nodeLinkRange = netip.MustParsePrefix("198.18.0.0/16")
)

// netnsPrefix starts the name of every generated control-plane netns; the
// owner's pid follows so that leftovers of crashed runs can be recognised.
const netnsPrefix = "nnm-cp-"

// vethLink is one veth pair. The local end (in localNS, "" = root netns) gets
// the first host address of prefix, the peer end (in peerNS) the second.
type vethLink struct {
	localNS, local string
	peerNS, peer   string
	prefix         netip.Prefix
}

func (l vethLink) localIP() netip.Addr { return l.prefix.Addr().Next() }
func (l vethLink) peerIP() netip.Addr  { return l.prefix.Addr().Next().Next() }

// ipCmd runs `ip [-n ns] args...` and returns an error naming the command and
// its output.
func (b binaries) ipCmd(ctx context.Context, ns string, args ...string) ([]byte, error) {
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	out, err := exec.CommandContext(ctx, b.ip, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// createVeth creates the pair with both ends up and addressed.
func (b binaries) createVeth(ctx context.Context, l vethLink) error {
	args := []string{"link", "add", l.local, "type", "veth", "peer", "name", l.peer}
	if l.peerNS != l.localNS {
		args = append(args, "netns", l.peerNS)
	}
	if _, err := b.ipCmd(ctx, l.localNS, args...); err != nil {
		return err
	}
	bits := strconv.Itoa(l.prefix.Bits())
	for _, end := range []struct {
		ns, dev string
		ip      netip.Addr
	}{{l.localNS, l.local, l.localIP()}, {l.peerNS, l.peer, l.peerIP()}} {
		if _, err := b.ipCmd(ctx, end.ns, "addr", "add", end.ip.String()+"/"+bits, "dev", end.dev); err != nil {
			b.deleteVeth(ctx, l)
			return err
		}
		if _, err := b.ipCmd(ctx, end.ns, "link", "set", end.dev, "up"); err != nil {
			b.deleteVeth(ctx, l)
			return err
		}
	}
	return nil
}

// deleteVeth deletes the pair (deleting one end removes both); a pair that is
// already gone is not an error.
func (b binaries) deleteVeth(ctx context.Context, l vethLink) error {
	if l.localNS != "" && !netns.Exists(l.localNS) {
		return nil
	}
	out, err := b.ipCmd(ctx, l.localNS, "link", "del", l.local)
	if err != nil && strings.Contains(string(out), "Cannot find device") {
		return nil
	}
	return err
}

// usedPrefixes lists the IPv4 destinations of all routes in a namespace
// (including local and connected routes), so new links avoid them.
func (b binaries) usedPrefixes(ctx context.Context, ns string) ([]netip.Prefix, error) {
	out, err := b.ipCmd(ctx, ns, "-j", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, err
	}
	var routes []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("parse `ip -j route` output: %w", err)
	}
	var used []netip.Prefix
	for _, r := range routes {
		if p, err := netip.ParsePrefix(r.Dst); err == nil {
			used = append(used, p.Masked())
		} else if a, err := netip.ParseAddr(r.Dst); err == nil {
			used = append(used, netip.PrefixFrom(a, a.BitLen()))
		} // "default" and the like are not specific ranges
	}
	return used, nil
}

func overlapsAny(p netip.Prefix, used []netip.Prefix) bool {
	for _, u := range used {
		if u.Bits() > 0 && u.Overlaps(p) {
			return true
		}
	}
	return false
}

// nthSlash30 returns the n-th /30 of r, or false past its end.
func nthSlash30(r netip.Prefix, n int) (netip.Prefix, bool) {
	count := 1 << (30 - r.Bits())
	if n < 0 || n >= count {
		return netip.Prefix{}, false
	}
	a := r.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n) * 4
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), 30), true
}

// pickHostLinkPrefix picks a random /30 of hostLinkRange that overlaps no
// route of the root netns; random so that concurrent test processes (each
// with its own control plane) rarely race for the same one.
func (b binaries) pickHostLinkPrefix(ctx context.Context) (netip.Prefix, error) {
	used, err := b.usedPrefixes(ctx, "")
	if err != nil {
		return netip.Prefix{}, err
	}
	count := 1 << (30 - hostLinkRange.Bits())
	start := rand.IntN(count)
	for i := range count {
		p, _ := nthSlash30(hostLinkRange, (start+i)%count)
		if !overlapsAny(p, used) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /30 left in %s in the root network namespace", hostLinkRange)
}

// pickNodeLinkPrefix returns the first /30 of nodeLinkRange from index next
// on that overlaps no route in either namespace, and the index after it.
func (b binaries) pickNodeLinkPrefix(ctx context.Context, cpNS, nodeNS string, next int) (netip.Prefix, int, error) {
	var used []netip.Prefix
	for _, ns := range []string{cpNS, nodeNS} {
		u, err := b.usedPrefixes(ctx, ns)
		if err != nil {
			return netip.Prefix{}, next, err
		}
		used = append(used, u...)
	}
	for n := next; ; n++ {
		p, ok := nthSlash30(nodeLinkRange, n)
		if !ok {
			return netip.Prefix{}, n, fmt.Errorf("no free /30 left in %s for netns %q", nodeLinkRange, nodeNS)
		}
		if !overlapsAny(p, used) {
			return p, n + 1, nil
		}
	}
}

// removeStale deletes control-plane namespaces (and their host veth and temp
// dirs) left behind by test processes that no longer exist, e.g. after a
// `go test` timeout killed the binary before its cleanups ran.
func (b binaries) removeStale(ctx context.Context) error {
	out, err := b.ipCmd(ctx, "", "netns", "list")
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		name := fields[0]
		pid, id, ok := parseNetnetns(name)
		if !ok || pid == os.Getpid() || processExists(pid) {
			continue
		}
		errs = append(errs, b.deleteVeth(ctx, vethLink{local: hostVethName(id)}))
		errs = append(errs, netns.Delete(ctx, name))
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), name+"-*"))
		for _, d := range dirs {
			errs = append(errs, os.RemoveAll(d))
		}
	}
	return errors.Join(errs...)
}

func generatedNetnetns(id string) string {
	return fmt.Sprintf("%s%d-%s", netnsPrefix, os.Getpid(), id)
}

// parseNetnetns splits "nnm-cp-<pid>-<id>".
func parseNetnetns(name string) (pid int, id string, ok bool) {
	rest, found := strings.CutPrefix(name, netnsPrefix)
	if !found {
		return 0, "", false
	}
	pidStr, id, found := strings.Cut(rest, "-")
	if !found {
		return 0, "", false
	}
	pid, err := strconv.Atoi(pidStr)
	return pid, id, err == nil && id != ""
}

func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// hostVethName is the root-netns end of the host link; at most 15 bytes.
func hostVethName(id string) string { return "nnmcp" + id }

// RemoveStale deletes control-plane namespaces, host veths and temp dirs left
// behind by test processes that died before Close ran (Start does this too).
func RemoveStale(ctx context.Context) error {
	ip, err := exec.LookPath("ip")
	if err != nil {
		return fmt.Errorf("iproute2 `ip` not found: %w", err)
	}
	return binaries{ip: ip}.removeStale(ctx)
}
