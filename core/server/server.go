// Package server serves /metrics, /healthz and /readyz.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Checks are the probes behind /healthz and /readyz; a nil error is healthy/ready.
type Checks struct {
	Healthy func() error
	Ready   func() error
}

// Server is the HTTP endpoint of the agent.
type Server struct {
	addr string
	srv  *http.Server
	log  *slog.Logger
	ln   net.Listener
	done chan struct{}
}

// New builds the handler; Start listens. An empty addr disables the server.
func New(addr string, reg *prometheus.Registry, checks Checks, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", probe(checks.Healthy))
	mux.HandleFunc("/readyz", probe(checks.Ready))
	return &Server{addr: addr, log: log, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
}

func probe(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if check != nil {
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ok: %v\n", err)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	}
}

// Addr is the address the server listens on (useful with port 0), "" before Start or when disabled.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Start listens (so a busy port fails start-up) and serves in the background.
func (s *Server) Start(context.Context) error {
	if s.addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	s.ln = ln
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics server stopped", "err", err)
		}
	}()
	s.log.Info("serving /metrics, /healthz, /readyz", "address", ln.Addr().String())
	return nil
}

// Stop shuts the server down and waits for it.
func (s *Server) Stop(ctx context.Context) error {
	if s.ln == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
