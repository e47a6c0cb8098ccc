package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// Slow clients (slowloris: headers never finished; TLS clients that never say hello; idle keep-alive
// connections) are cut off by the listener's limits instead of holding a goroutine each, on both the
// HTTPS metrics listener and the plain probe listener.
func TestSlowClientsDoNotPileUp(t *testing.T) {
	tlsCfg, err := TLSConfig("", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	limits := Limits{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: time.Second, IdleTimeout: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10}
	s := New(Options{MetricsAddress: "127.0.0.1:0", HealthzAddress: "127.0.0.1:0", TLS: tlsCfg, Limits: limits},
		prometheus.NewRegistry(), Checks{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())

	// What runs before the slow clients come: all that may run once the limits cut them off.
	before := goleak.IgnoreCurrent()
	base := runtime.NumGoroutine()
	const n = 50
	// held is the most goroutines seen at once while the slow clients came: the limits cut the first
	// ones off after 300 ms, which the dialing may outlast on a loaded machine.
	held := 0
	note := func() { held = max(held, runtime.NumGoroutine()) }
	var conns []net.Conn
	for i := range n {
		for _, addr := range []string{s.Addr(), s.HealthzAddr()} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			if addr == s.HealthzAddr() || i%2 == 0 {
				// Half a request, never finished (on the TLS port: garbage before the handshake).
				if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil {
					t.Fatal(err)
				}
			} // else: a TLS client that never sends its hello
			note()
		}
	}
	err = agenttest.Poll(t.Context(), 5*time.Second, 10*time.Millisecond, func() error {
		if note(); held < base+n {
			return fmt.Errorf("goroutines %d with %d slow connections open, base %d: the test does not hold connections", held, len(conns), base)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every connection is closed by the server within the limits.
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(c) // returns at EOF (or an HTTP 408 then EOF); a timeout means it was never closed
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %s still open after 5s", c.LocalAddr())
		}
		c.Close()
	}
	// Until only the goroutines of before are left (goleak.Find retries for half a second; a loaded
	// machine may take longer to end them), or it reports those that stayed.
	if err := agenttest.Poll(t.Context(), 10*time.Second, 100*time.Millisecond, func() error { return goleak.Find(before) }); err != nil {
		t.Errorf("goroutines left after the slow clients were cut off: %v", err)
	}
	t.Logf("goroutines: %d before, %d with %d slow connections, %d after the limits cut them", base, held, len(conns), runtime.NumGoroutine())

	// A header block over MaxHeaderBytes is refused (431), not buffered.
	req, _ := http.NewRequest("GET", "http://"+s.HealthzAddr()+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB header with MaxHeaderBytes 4 KiB: status %d, want 431", resp.StatusCode)
	}

	// The HTTPS listener still serves normal clients.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.CloseIdleConnections()
	resp, err = (&http.Client{Transport: tr}).Get("https://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("https /metrics: %d", resp.StatusCode)
	}
}
