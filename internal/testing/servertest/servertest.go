// Package servertest runs the agent's HTTP server (internal/server) in the test process as deploy/base
// configures it: /metrics over HTTPS with a self-signed certificate, behind delegated authentication
// and authorization through a real API server.
package servertest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/server"
)

// StartDelegated starts the server with opts (MetricsAddress defaults to 127.0.0.1:0; TLS and Auth
// are set here), reviewing tokens and access through client, and stops it when the test ends. Its
// one metric is the gauge named gauge, with value 1, so that a scrape can tell it got the metrics.
func StartDelegated(t testing.TB, client kube.Interface, gauge string, opts server.Options) *server.Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tlsCfg, err := server.TLSConfig("", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if opts.MetricsAddress == "" {
		opts.MetricsAddress = "127.0.0.1:0"
	}
	opts.TLS, opts.Auth = tlsCfg, server.NewDelegated(client, log).Wrap
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: gauge, Help: "test"}, func() float64 { return 1 }))
	s := server.New(opts, reg, server.Checks{}, log)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	return s
}

// Flood opens perSource connections from each of sources to addr (over TLS when useTLS), makes one
// keep-alive request for path on each (counting the answers in answered) and keeps it open, idle,
// until the server closes it; redial later it dials again, as a flooder would, until ctx ends. It
// returns at once; wait is done when every connection is closed after ctx ended. The dialer's
// sockets leave from each source (an address of the calling process's namespace).
func Flood(ctx context.Context, sources []string, perSource int, addr string, useTLS bool, path string, redial time.Duration, answered, failed *atomic.Int64) (wait func()) {
	var wg sync.WaitGroup
	for i := range len(sources) * perSource {
		src := sources[i%len(sources)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if !IdleConn(ctx, src, addr, useTLS, path, answered) && failed != nil {
					failed.Add(1)
				}
				select { // the server closed it (or refused it): dial again
				case <-ctx.Done():
				case <-time.After(redial):
				}
			}
		}()
	}
	return wg.Wait
}

// IdleConn dials addr from src, makes one keep-alive request for path (counting the answer in
// answered), and keeps the connection open, idle, until the server closes it or ctx ends; false when
// no answer came.
func IdleConn(ctx context.Context, src, addr string, useTLS bool, path string, answered *atomic.Int64) bool {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a bound on the test, far beyond any limit
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if useTLS {
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		if err := tc.HandshakeContext(ctx); err != nil {
			return false
		}
		c = tc
	}
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return false
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	answered.Add(1)
	_, _ = br.ReadByte() // idle until the server closes the connection
	return true
}
