package server_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/server"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/servertest"
)

// TestIdleFloodDoesNotStarveProbesOrScrape (#41 row 3): idle keep-alive connections to the plain
// probe port and the HTTPS metrics port used to be held without bound (20,000 of them, ~20 KB each,
// and /livez timed out at the kubelet's 3 s). With the agent's default limits, against the real API
// server for the scrape's authentication: 2,000 idle keep-alive connections to the probe port and
// 600 to the metrics port, from 100 and 30 loopback sources, each re-dialled 2 s after the agent
// closes it, the listeners hold at most MaxConns each (counted in the kernel's socket table), /livez
// answers 200 from sources that do not flood, and so does an authenticated scrape with
// an uncached token. The flooders share the test's CPU with the server (and the machine is shared),
// so the latencies are printed and bounded only by 10 s; docs/deploy.md has measured ones.
func TestIdleFloodDoesNotStarveProbesOrScrape(t *testing.T) {
	cp := controlplane.StartT(t, controlplane.Options{})
	token := scraperToken(t, cp)
	client := agentClient(t, cp, new(atomic.Int64))
	s := servertest.StartDelegated(t, client, "nnm_idle_flood_test", server.Options{HealthzAddress: "127.0.0.1:0"})
	probeAddr, metricsAddr := s.HealthzAddr(), s.Addr()

	ctx, stop := context.WithCancel(t.Context())
	var opened, failed atomic.Int64
	start := time.Now()
	waitProbe := servertest.Flood(ctx, loopbackSources("127.0.", 10, 100), 20, probeAddr, false, "/livez", 2*time.Second, &opened, &failed)
	waitMetrics := servertest.Flood(ctx, loopbackSources("127.1.", 0, 30), 20, metricsAddr, true, "/metrics", 2*time.Second, &opened, &failed)
	defer func() { stop(); waitProbe(); waitMetrics() }()
	// With the limits at most 2 × 256 are held at a time; the others are refused or closed.
	// The flood has had its chance to fill both listeners: twice MaxConns answered, or 30 s.
	_ = agenttest.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		if opened.Load() < 2*int64(server.DefaultLimits.MaxConns) {
			return errors.New("fewer than 2 × MaxConns answered")
		}
		return nil
	})
	t.Logf("flood: %d connections answered and kept idle in %v (%d closed or refused before an answer)", opened.Load(), time.Since(start).Round(time.Millisecond), failed.Load())

	probeHeld, metricsHeld := established(t, probeAddr), established(t, metricsAddr)
	var worst time.Duration
	for i := range 20 {
		src := fmt.Sprintf("127.0.200.%d", 1+i%2) // not flooding (a flooding source at its cap is refused)
		t0 := time.Now()
		code, body, err := netns.Get(ctx, plainFrom(src), "http://"+probeAddr+"/livez", "")
		took := time.Since(t0)
		worst = max(worst, took)
		if err != nil || code != http.StatusOK || took > 10*time.Second {
			t.Errorf("/livez from %s during the flood: %d %q %v after %v", src, code, body, err, took.Round(time.Millisecond))
		}
	}
	t0 := time.Now()
	code, body, err := netns.Get(ctx, fromAddr("127.2.0.1"), "https://"+metricsAddr+"/metrics", token)
	scrapeTook := time.Since(t0)
	t.Logf("during the flood: the probe listener held %d connections, the metrics listener %d (MaxConns %d); worst of 20 /livez %v; an uncached authenticated scrape %d in %v",
		probeHeld, metricsHeld, server.DefaultLimits.MaxConns, worst.Round(time.Millisecond), code, scrapeTook.Round(time.Millisecond))
	if err != nil || code != http.StatusOK || !strings.Contains(body, "nnm_idle_flood_test 1") || scrapeTook > 10*time.Second {
		t.Errorf("the legitimate scrape during the flood: %d %v after %v: %.200q", code, err, scrapeTook.Round(time.Millisecond), body)
	}
	if limit := server.DefaultLimits.MaxConns + 1; probeHeld > limit || metricsHeld > limit {
		t.Errorf("held connections: probe %d, metrics %d; want at most MaxConns (%d) each", probeHeld, metricsHeld, server.DefaultLimits.MaxConns)
	}
}

// loopbackSources are n loopback addresses prefix<third>.<fourth> from prefix<first>.1 on, 250 to a
// third octet.
func loopbackSources(prefix string, first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d.%d", prefix, first+i/250, 1+i%250)
	}
	return out
}

// plainFrom is an HTTP client whose connections leave from the loopback address src.
func plainFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// established counts the connections the listener at addr has accepted and not closed: the server
// side's established TCP connections in the kernel's socket table (/proc/net/tcp of the test's
// network namespace) less those still in the listening socket's accept queue.
func established(t *testing.T, addr string) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	want := fmt.Sprintf(":%04X", p)
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 5 || !strings.HasSuffix(fs[1], want) {
				continue
			}
			switch fs[3] {
			case "01": // ESTABLISHED
				n++
			case "0A": // LISTEN: tx_queue:rx_queue, the accept queue's length in rx_queue
				_, q, _ := strings.Cut(fs[4], ":")
				queued, _ := strconv.ParseInt(q, 16, 64)
				n -= int(queued)
			}
		}
	}
	return n
}
