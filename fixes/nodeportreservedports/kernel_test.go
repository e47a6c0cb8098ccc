package nodeportreservedports

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// labConnections is how many outgoing connections the lab opens: with ip_local_port_range
// 1024-65535 about 2,768/64,512 of them (4.3 %) take a NodePort of 30000-32767 as their source port.
const labConnections = 3000

// TestKernelEphemeralPorts reproduces the collision in a network namespace of its own (both sysctls
// are per namespace): a node whose ephemeral range is 1024-65535, a common tuning, opens
// labConnections connections to a server; without the fix some take a NodePort as their source port
// (the precondition of kubernetes#111682 and #139276: in IPVS mode their replies are taken for the
// Service); with it, none does. Disabled, the fix gives the namespace its value back; the host's
// values never change.
func TestKernelEphemeralPorts(t *testing.T) {
	netns.RequireKernel(t, "ip", "sysctl")
	node, server := netns.NewNoDAD(t, "nnm-npr-node"), netns.NewNoDAD(t, "nnm-npr-srv")
	node.Veth("eth0", server, "eth0")
	node.AddAddrs("eth0", "192.0.2.1/24")
	// labConnections distinct destinations (30 addresses × 100 ports): the kernel picks each one's
	// source port from its own offset (a hash of the destination), not from one sequence.
	for i := range 30 {
		server.AddAddrs("eth0", fmt.Sprintf("192.0.2.%d/24", 2+i))
	}
	host := map[string]string{}
	for _, name := range []string{LocalPortRange, ReservedPorts} {
		v, err := nodestate.NewSysctl().Get(name)
		if err != nil {
			netns.Unavailable(t, "%v", err)
		}
		host[name] = v
	}
	defer func() {
		for name, v := range host {
			if now, _ := nodestate.NewSysctl().Get(name); now != v {
				t.Errorf("THE HOST'S %s CHANGED: %q -> %q", name, v, now)
			}
		}
	}()
	node.MustExec("sysctl", "-qw", LocalPortRange+"=1024 65535")
	for p := range 100 {
		netns.Serve(server.Listen(t, fmt.Sprintf("0.0.0.0:%d", 8000+p)), func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	}

	nodePorts := Range{30000, 32767}
	// connect opens labConnections connections at once (held, so each has its own source port) and
	// counts those whose source port is a NodePort.
	connect := func(when string) int {
		t.Helper()
		hit := 0
		var conns []net.Conn
		if err := node.Do(func() error {
			for i := range labConnections {
				c, err := net.Dial("tcp", fmt.Sprintf("192.0.2.%d:%d", 2+i%30, 8000+i/30%100))
				if err != nil {
					return err
				}
				conns = append(conns, c)
				p := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
				if int(p) >= nodePorts.From && int(p) <= nodePorts.To {
					hit++
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			c.Close()
		}
		t.Logf("%s: %d of %d connections from the node took a NodePort (%s) as their source port", when, hit, labConnections, nodePorts)
		return hit
	}
	if n := connect("without the fix"); n == 0 {
		t.Fatalf("no connection took a NodePort: the collision did not reproduce")
	}

	f, err := New(fix.Params{Sysctl: nodestate.NewSysctl(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Configure(map[string]any{"stateDir": t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	var res fix.Result
	if err := node.Do(func() (err error) { res, err = f.Ensure(t.Context(), testkit.Snapshot(), true); return err }); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(node.MustExec("sysctl", "-n", ReservedPorts)); !res.Changed || got != "30000-32767" {
		t.Fatalf("Ensure: %+v, %s %q", res, ReservedPorts, got)
	}
	if n := connect("with nodeport-reserved-ports"); n != 0 {
		t.Errorf("%d connections took a reserved NodePort", n)
	}
	if err := node.Do(func() error { return f.Revert(t.Context()) }); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(node.MustExec("sysctl", "-n", ReservedPorts)); got != "" {
		t.Errorf("after Revert: %s %q, want it empty again", ReservedPorts, got)
	}
}
