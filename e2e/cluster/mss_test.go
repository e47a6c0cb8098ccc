package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// The MSS black hole with a real Pod: client-a on node-a downloads from a server behind a router
// whose link towards the nodes is narrower (1400 bytes) than the nodes' and the server's (1500), and
// that drops the ICMP "fragmentation needed" it would answer with (its output hook). node-a's route
// to the server's network says `mtu 1400`, as a route over a tunnel or a narrow uplink would. Without
// the agent the handshake passes, then every full-size segment from the server is lost: the download
// stalls. With mss-clamp (enabled in the ConfigMap, as docs/deploy.md says) node-a clamps the MSS of
// the Pod's SYN to what its route carries, and the download completes.
//
//	client-a ─ node-a ══(bridge; route mtu 1400)══ router (eth0 mtu 1400, ICMP dropped) ─ server
const (
	routerIP      = "192.168.100.60" // the router's address on the cluster's bridge
	farNet        = "192.168.200.0/24"
	farRouterIP   = "192.168.200.1"
	farServerIP   = "192.168.200.2"
	narrowMTU     = "1400"
	downloadPort  = 9000
	downloadBytes = 1 << 20
	// downloadTimeout is the client's: a download that has not completed within it "stalls".
	downloadTimeout = "20s"
)

// newMSSPath makes the router and the server (namespaces of the test) and node-a's route.
func newMSSPath(t *testing.T, c *Cluster) string {
	cpNS := c.cp.Netns()
	rtr := netns.NewNoDAD(t, "nnmcl-rtr")
	srv := netns.NewNoDAD(t, "nnmcl-srv")
	rtr.Veth("eth0", netns.Existing(t, cpNS), "rtr-br")
	mustNS(t, cpNS, "ip", "link", "set", "rtr-br", "mtu", narrowMTU)
	mustNS(t, cpNS, "ip", "link", "set", "rtr-br", "master", bridge)
	// A port of 1400 bytes would lower the bridge's own MTU: the rest of the bridge stays at 1500.
	mustNS(t, cpNS, "ip", "link", "set", bridge, "mtu", "1500")
	rtr.MustExec("ip", "link", "set", "eth0", "mtu", narrowMTU)
	rtr.AddAddrs("eth0", routerIP+bridgeBits)
	rtr.Veth("eth1", srv, "eth0")
	rtr.AddAddrs("eth1", farRouterIP+"/24")
	rtr.MustExec("sysctl", "-qw", "net.ipv4.ip_forward=1")
	rtr.NftLoad("table ip nnmcl-blackhole { chain out { type filter hook output priority 0; ip protocol icmp drop; }; }")
	srv.AddAddrs("eth0", farServerIP+"/24")
	srv.MustExec("ip", "route", "add", "default", "via", farRouterIP)
	if out, err := c.node("node-a").Shell(t.Context(), c, "ip route add "+farNet+" via "+routerIP+" mtu "+narrowMTU); err != nil {
		t.Fatalf("node-a's route to %s: %v: %s", farNet, err, out)
	}
	addr := farServerIP + ":" + strconv.Itoa(downloadPort)
	ln := srv.Listen(t, addr)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(time.Minute))
				line, err := bufio.NewReader(conn).ReadString('\n')
				n, perr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "get "))
				if err != nil || perr != nil {
					return
				}
				_, _ = io.CopyN(conn, zeros{}, int64(n))
			}()
		}
	}()
	return addr
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// download runs the workload's download in client-a and returns the outcome for the table.
func download(ctx context.Context, c *Cluster, addr string) (string, bool) {
	out, err := c.Kubectl(ctx, "", "-n", testNS, "exec", "client-a", "--", "/workload", "download", addr, strconv.Itoa(downloadBytes), downloadTimeout)
	if err != nil {
		why := lastLine(err.Error())
		if _, w, ok := strings.Cut(err.Error(), "workload: "); ok {
			why, _, _ = strings.Cut(w, "\n")
		}
		return "stalls (" + why + ")", false
	}
	return "completes (" + strings.TrimSpace(lastLine(out)) + ")", true
}

func mssRowClient() string {
	return fmt.Sprintf("Pod on node-a → server behind a %s-byte link, ICMP dropped (%d KiB download)", narrowMTU, downloadBytes>>10)
}
