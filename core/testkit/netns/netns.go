package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"
)

// RunDir is where iproute2 keeps named network namespaces.
const RunDir = "/run/netns"

// Path is the file of the named namespace under RunDir.
func Path(name string) string { return filepath.Join(RunDir, name) }

// Exists reports whether the named namespace exists.
func Exists(name string) bool {
	_, err := os.Stat(Path(name))
	return err == nil
}

// Create makes the named network namespace (`ip netns add`) and brings its loopback up.
func Create(ctx context.Context, name string) error {
	if _, err := run(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	if _, err := run(ctx, "ip", "-n", name, "link", "set", "lo", "up"); err != nil {
		_ = Delete(ctx, name)
		return err
	}
	return nil
}

// Delete kills whatever still runs in the named namespace, then deletes it. A namespace that does not
// exist is not an error.
func Delete(ctx context.Context, name string) error {
	if !Exists(name) {
		return nil
	}
	if out, err := run(ctx, "ip", "netns", "pids", name); err == nil {
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_, err := run(ctx, "ip", "netns", "del", name)
	return err
}

// Command is `ip netns exec <name> args...`: the process lives in the namespace (with /sys
// remounted to match it, as iproute2 does).
func Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", name}, args...)...)
}

// Exec runs args in the named namespace (Command) and returns the combined output; an error names
// the command and the namespace and carries the output.
func Exec(ctx context.Context, name string, args ...string) (string, error) {
	out, err := Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (in netns %s): %w: %s", strings.Join(args, " "), name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Output is Exec with the command's standard output alone; its standard error goes into an error
// only. For dumps that a tool may warn beside on success (iptables-save without
// /etc/xtables/connlabel.conf warns for each -m connlabel rule it prints).
func Output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := Command(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s (in netns %s): %w: %s", strings.Join(args, " "), name, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// run runs a host command (iproute2 managing namespaces), with the same error form as Exec.
func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Do runs fn on an OS thread that has entered the network namespace at path; processes fn starts
// and sockets it opens live there. The caller's own thread never changes namespace. If the thread
// cannot move back it stays locked, and the Go runtime discards it when fn's goroutine ends.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return from netns %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialContext returns a dialer whose sockets are created inside the network namespace at path: for
// HTTP clients that reach servers listening on a namespace's loopback.
func DialContext(path string, d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := Do(path, func() error {
			var err error
			conn, err = d.DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}

// HTTPClient returns a client whose connections are made inside the named namespace (DialContext),
// without keep-alives, for probing servers that listen on a namespace's loopback (the agent's
// /metrics, kube-proxy's /proxyMode). Its timeout is generous: a loaded CI machine answers slowly.
func HTTPClient(name string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext:       DialContext(Path(name), &net.Dialer{Timeout: 2 * time.Second}),
		},
	}
}

// Get fetches url with client, with "Authorization: Bearer <bearer>" unless bearer is empty, and
// returns the status code and the body.
func Get(ctx context.Context, client *http.Client, url, bearer string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// NS is a named network namespace created for one test (New).
type NS struct {
	Name string
	t    testing.TB
}

// New creates a namespace named prefix-<random> with loopback up, deleted when the test ends. It ends
// the test (Unavailable: skip, or fail under CI) when namespaces cannot be made here.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	Require(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	if err := Create(context.Background(), name); err != nil {
		Unavailable(t, "cannot create network namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := Delete(context.Background(), name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	return &NS{Name: name, t: t}
}

// Path is the namespace's file under RunDir.
func (ns *NS) Path() string { return Path(ns.Name) }

// Command is a command to run inside the namespace (Command).
func (ns *NS) Command(args ...string) *exec.Cmd {
	return Command(context.Background(), ns.Name, args...)
}

// Exec runs a command inside the namespace and returns its combined output.
func (ns *NS) Exec(args ...string) (string, error) {
	return Exec(context.Background(), ns.Name, args...)
}

// MustOutput runs a command inside the namespace and returns its standard output (Output); it
// fails the test on error.
func (ns *NS) MustOutput(args ...string) string {
	ns.t.Helper()
	out, err := Output(context.Background(), ns.Name, args...)
	if err != nil {
		ns.t.Fatal(err)
	}
	return out
}

// MustExec is Exec that fails the test on error.
func (ns *NS) MustExec(args ...string) string {
	ns.t.Helper()
	out, err := ns.Exec(args...)
	if err != nil {
		ns.t.Fatal(err)
	}
	return out
}

// Do runs fn on an OS thread inside the namespace (see the package function Do).
func (ns *NS) Do(fn func() error) error { return Do(ns.Path(), fn) }

// Run runs name with args inside the namespace, stdin (when not nil) as its input and stdout (when
// not nil) receiving its output, and returns what it wrote to stderr: the command-runner seam of the
// iptables backend (iptables.Runner), so a real backend can be pointed at the namespace.
func (ns *NS) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	cmd := Command(ctx, ns.Name, append([]string{name}, args...)...)
	cmd.Stdin, cmd.Stdout = stdin, stdout
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	return errb.Bytes(), err
}

// Existing wraps a namespace that the test did not create (a VM's initial one, attached by
// `ip netns attach`); it is not deleted when the test ends.
func Existing(t testing.TB, name string) *NS {
	t.Helper()
	if !Exists(name) {
		t.Fatalf("network namespace %s does not exist", name)
	}
	return &NS{Name: name, t: t}
}

// NewNoDAD is New with IPv6 duplicate address detection off, so addresses are usable at once (links
// created into the namespace inherit the "default" setting).
func NewNoDAD(t testing.TB, prefix string) *NS {
	t.Helper()
	ns := New(t, prefix)
	ns.MustExec("sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	return ns
}

// Veth links ns (interface aIf) with b (interface bIf, which may be ns itself); both ends are up.
func (ns *NS) Veth(aIf string, b *NS, bIf string) {
	ns.t.Helper()
	if b == ns {
		ns.MustExec("ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf)
	} else {
		ns.MustExec("ip", "link", "add", aIf, "type", "veth", "peer", "name", bIf, "netns", b.Name)
	}
	ns.MustExec("ip", "link", "set", aIf, "up")
	b.MustExec("ip", "link", "set", bIf, "up")
}

// AddAddrs adds addresses (CIDR notation) to dev; IPv6 ones without duplicate address detection.
func (ns *NS) AddAddrs(dev string, cidrs ...string) {
	ns.t.Helper()
	for _, c := range cidrs {
		args := []string{"ip", "addr", "add", c, "dev", dev}
		if strings.Contains(c, ":") {
			args = append(args, "nodad")
		}
		ns.MustExec(args...)
	}
}

// NftLoad loads an nft ruleset (`nft -f -`) in the namespace and fails the test on error.
func (ns *NS) NftLoad(ruleset string) {
	ns.t.Helper()
	if stderr, err := ns.Run(context.Background(), "nft", []string{"-f", "-"}, strings.NewReader(ruleset), nil); err != nil {
		ns.t.Fatalf("nft -f in %s: %v: %s", ns.Name, err, stderr)
	}
}

// Listen opens a TCP listener inside the namespace, closed when t ends.
func (ns *NS) Listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	return openIn(t, ns, "tcp "+addr, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// ListenPacket opens a UDP socket inside the namespace, closed when t ends.
func (ns *NS) ListenPacket(t testing.TB, addr string) net.PacketConn {
	t.Helper()
	return openIn(t, ns, "udp "+addr, func() (net.PacketConn, error) { return net.ListenPacket("udp", addr) })
}

// openIn opens a socket (what: its protocol and address) inside the namespace, failing the test
// with the cause, and closes it when t ends.
func openIn[S io.Closer](t testing.TB, ns *NS, what string, open func() (S, error)) S {
	t.Helper()
	var sock S
	if err := ns.Do(func() (err error) { sock, err = open(); return }); err != nil {
		t.Fatalf("listen on %s in %s: %v", what, ns.Name, err)
	}
	t.Cleanup(func() { sock.Close() })
	return sock
}

// Serve accepts connections on ln until it is closed (ns.Listen's: when the test ends) and hands each
// to handle, in a goroutine of its own.
func Serve(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// ServePackets answers every datagram on pc with what reply returns for it, until pc is closed.
func ServePackets(pc net.PacketConn, reply func(from net.Addr, datagram []byte) []byte) {
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(reply(from, buf[:n]), from)
		}
	}()
}

// ChildEnv tells a test binary that it runs as the child of RunChild, and which test it runs.
const ChildEnv = "NNM_TEST_CHILD"

// RunChild runs this test binary again, entirely inside the namespace, running only the test named
// child (which calls Child first) with env added, and returns the child's stdout and stderr: every
// probe the child makes (dials, link lookups, iptables and nft) then sees the namespace, never the host.
func (ns *NS) RunChild(child string, env ...string) (stdout, stderr []byte, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cmd := ns.Command(self, "-test.run=^"+child+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{ChildEnv + "=" + child}, env...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.Bytes(), errb.Bytes(), err
}

// Child skips the test unless this process is the child RunChild started for it: the test is the
// body of parent's child process, not a test of its own.
func Child(t testing.TB, parent string) {
	t.Helper()
	if os.Getenv(ChildEnv) != t.Name() {
		t.Skipf("the child process of %s", parent)
	}
}
