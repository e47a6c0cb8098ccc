package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testenv"
)

// backends are the agent's rule backends; every "with agent" case runs once per backend, each time in
// a fresh topology.
var backends = []string{"iptables", "nftables"}

// require skips the test unless it runs as root with the agent binary and the given tools.
func require(t *testing.T, tools ...string) {
	t.Helper()
	testenv.Require(t, tools...)
	agenttest.Require(t)
}

// newNS creates a namespace with IPv6 duplicate address detection off, so addresses are usable at
// once (links created into it inherit the "default" setting).
func newNS(t *testing.T, prefix string) *testenv.NS {
	t.Helper()
	ns := testenv.New(t, prefix)
	ns.MustExec("sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	return ns
}

// veth links a (interface aIf) with b (interface bIf); both ends are up.
func veth(a *testenv.NS, aIf string, b *testenv.NS, bIf string) {
	if a == b {
		a.MustExec("ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf)
	} else {
		a.MustExec("ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b.Name)
	}
	a.MustExec("ip", "link", "set", aIf, "up")
	b.MustExec("ip", "link", "set", bIf, "up")
}

// addAddrs adds addresses (CIDR notation) to dev; IPv6 ones without DAD.
func addAddrs(ns *testenv.NS, dev string, cidrs ...string) {
	for _, c := range cidrs {
		args := []string{"ip", "addr", "add", c, "dev", dev}
		if strings.Contains(c, ":") {
			args = append(args, "nodad")
		}
		ns.MustExec(args...)
	}
}

// nftLoad loads an nft ruleset file into the namespace.
func nftLoad(t *testing.T, ns *testenv.NS, name, ruleset string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".nft")
	if err := os.WriteFile(path, []byte(ruleset), 0o644); err != nil {
		t.Fatal(err)
	}
	ns.MustExec("nft", "-f", path)
}

var packetsRE = regexp.MustCompile(`packets (\d+)`)

// nftCounter reads a named counter of an nft table.
func nftCounter(t *testing.T, ns *testenv.NS, family, table, name string) uint64 {
	t.Helper()
	out := ns.MustExec("nft", "list", "counter", family, table, name)
	m := packetsRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no packet count in `nft list counter %s %s %s`:\n%s", family, table, name, out)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

var invalidRE = regexp.MustCompile(`\binvalid=(\d+)`)

// conntrackInvalid sums conntrack's per-CPU "invalid" statistic of the namespace (`conntrack -S`).
func conntrackInvalid(t *testing.T, ns *testenv.NS) uint64 {
	t.Helper()
	out := ns.MustExec("conntrack", "-S")
	var total uint64
	found := false
	for _, m := range invalidRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		total += n
		found = true
	}
	if !found {
		t.Fatalf("no invalid= field in `conntrack -S`:\n%s", out)
	}
	return total
}

// listen opens a TCP listener inside ns.
func listen(t *testing.T, ns *testenv.NS, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return }); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dial opens a TCP connection from inside the namespace at nsPath.
func dial(ctx context.Context, nsPath string, addr netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := testenv.Do(nsPath, func() (err error) {
		c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr.String())
		return
	})
	return c, err
}

// fetch connects from ns to addr and reads everything the server sends until it closes. Any failure
// within timeout (connect or read) is an error.
func fetch(ctx context.Context, ns *testenv.NS, addr netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	c, err := dial(ctx, ns.Path(), addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	b, err := io.ReadAll(c)
	if err != nil {
		return string(b), err
	}
	return string(b), nil
}

// readChunks reads from c in the background; each read (or the final error) arrives on the channel.
type chunk struct {
	data string
	err  error
}

func readChunks(c net.Conn) <-chan chunk {
	ch := make(chan chunk, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				ch <- chunk{data: string(buf[:n])}
			}
			if err != nil {
				ch <- chunk{err: err}
				return
			}
		}
	}()
	return ch
}

// readExactly reads len(want) bytes with a deadline and compares them.
func readExactly(c net.Conn, want string, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read %q: %w", want, err)
	}
	if string(buf) != want {
		return fmt.Errorf("read %q, want %q", buf, want)
	}
	return nil
}

// waitFor polls cond every 20 ms until it is true or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// parallel runs the functions concurrently and returns their results in order.
func parallel[T any](fns ...func() T) []T {
	out := make([]T, len(fns))
	var wg sync.WaitGroup
	for i, f := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f()
		}()
	}
	wg.Wait()
	return out
}

// isReset reports whether err is "connection reset by peer".
func isReset(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "connection reset by peer"))
}
