// Package servertest runs the agent's HTTP server (internal/server) in the test process as deploy/base
// configures it: /metrics over HTTPS with a self-signed certificate, behind delegated authentication
// and authorization through a real API server.
package servertest

import (
	"context"
	"io"
	"log/slog"
	"testing"

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
