// Package server serves /metrics, /healthz and /readyz: the metrics on their own listener, plain or
// HTTPS with delegated authentication and authorization (Delegated), the probes plain HTTP on theirs
// (or next to plain metrics when no probe address is set).
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
)

// Checks are the probes behind /healthz, /readyz and /livez; a nil error is healthy/ready/alive.
// /livez (liveness) says the sync workers are alive, not that syncs succeed.
type Checks struct {
	Alive   func() error
	Healthy func() error
	Ready   func() error
}

// Limits bound what one client can hold on every listener: slow or idle clients are cut off instead of
// piling up goroutines and sockets.
type Limits struct {
	ReadHeaderTimeout time.Duration // request line and headers (and, on HTTPS, the TLS handshake)
	ReadTimeout       time.Duration // the whole request
	WriteTimeout      time.Duration // the response (a /metrics scrape)
	IdleTimeout       time.Duration // a keep-alive connection between requests
	MaxHeaderBytes    int
	// MaxConns and MaxConnsPerSource cap the connections a listener holds, in all and from one
	// source (an IPv4 address, an IPv6 /64: Source); 0 is no cap. A source at its cap is refused;
	// at the listener's cap an idle connection of the source holding the most is closed to admit a
	// source holding fewer (connLimiter), so a flood of idle connections cannot keep a kubelet probe
	// or a scrape out.
	MaxConns, MaxConnsPerSource int
}

// DefaultLimits fit a scrape every few seconds and kubelet probes; 16 KiB of headers leaves room for a
// service account token. 256 connections of ~20 KiB each (goroutine, buffers, TLS state) bound a
// listener's share of the agent's memory to ~5 MiB; a scraper or the kubelet needs one or two
// connections at a time. docs/deploy.md lists them for operators.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      30 * time.Second,
	IdleTimeout:       90 * time.Second,
	MaxHeaderBytes:    16 << 10,
	MaxConns:          256,
	MaxConnsPerSource: 16,
}

// Options say where and how to serve.
type Options struct {
	// MetricsAddress serves /metrics; empty disables it.
	MetricsAddress string
	// HealthzAddress serves /healthz and /readyz over plain HTTP; empty serves them on MetricsAddress
	// (without authentication, also when the metrics are protected).
	HealthzAddress string
	// TLS, when set, serves the metrics listener over HTTPS.
	TLS *tls.Config
	// Auth, when set, wraps /metrics (see Delegated.Wrap).
	Auth func(http.Handler) http.Handler
	// Limits apply to every listener; zero means DefaultLimits.
	Limits Limits
}

type listener struct {
	name, addr string
	tls        *tls.Config
	limits     Limits
	srv        *http.Server
	ln         net.Listener
	conns      *connLimiter
	done       chan struct{}
}

// Server is the HTTP endpoint of the agent.
type Server struct {
	metrics, healthz *listener
	log              *slog.Logger
}

// New builds the handlers; Start listens.
func New(opts Options, reg *prometheus.Registry, checks Checks, log *slog.Logger) *Server {
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits
	}
	var metricsH http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	if opts.Auth != nil {
		metricsH = opts.Auth(metricsH)
	}
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", probe("/healthz", checks.Healthy, log))
	probes.HandleFunc("/readyz", probe("/readyz", checks.Ready, log))
	probes.HandleFunc("/livez", probe("/livez", checks.Alive, log))

	s := &Server{log: log}
	if reg != nil {
		if err := reg.Register(connCollector{s}); err != nil {
			log.Warn("cannot register the server's connection metrics", "err", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsH)
	if opts.HealthzAddress == "" {
		mux.Handle("/", probes)
	} else {
		s.healthz = newListener("healthz", opts.HealthzAddress, nil, probes, opts.Limits, log)
	}
	if opts.MetricsAddress != "" {
		s.metrics = newListener("metrics", opts.MetricsAddress, opts.TLS, mux, opts.Limits, log)
	}
	return s
}

func newListener(name, addr string, tlsCfg *tls.Config, h http.Handler, l Limits, log *slog.Logger) *listener {
	return &listener{name: name, addr: addr, tls: tlsCfg, limits: l, srv: &http.Server{
		Handler:     serving(h),
		ConnContext: connContext,
		// Handshake errors of scanners and plain-HTTP clients are not the agent's problem.
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}}
}

// probe answers a check. The probes are unauthenticated and, with hostNetwork, reachable from every
// pod, so a failure is answered with a short status (Short of the check's errors: which fix and
// family, for how long, what kind of problem) and the whole error, which may hold host paths and
// command output, goes to the log, once per change.
func probe(path string, check func() error, log *slog.Logger) http.HandlerFunc {
	var mu sync.Mutex
	last := ""
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var err error
		if check != nil {
			err = check()
		}
		full := ""
		if err != nil {
			full = err.Error()
		}
		mu.Lock()
		changed := full != last
		last = full
		mu.Unlock()
		if err == nil {
			fmt.Fprintln(w, "ok")
			return
		}
		if changed {
			log.Warn("probe failing", "path", path, "err", err)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ok: %s\n", Short(err))
	}
}

// Short is what an unauthenticated client sees of a failed check: for each problem its Short()
// when it has one (engine.ProbeError), else only that it fails.
func Short(err error) string {
	var out []string
	for _, e := range fix.ErrorLeaves(err) {
		var s interface{ Short() string }
		if errors.As(e, &s) {
			out = append(out, s.Short())
		} else {
			out = append(out, "failing (the details are in the agent's log)")
		}
	}
	return strings.Join(out, "\n")
}

// Addr is the address the metrics listener listens on (useful with port 0), "" before Start or when
// disabled.
func (s *Server) Addr() string { return s.metrics.address() }

// HealthzAddr is the probe listener's address, "" when the probes share the metrics listener.
func (s *Server) HealthzAddr() string { return s.healthz.address() }

// Conns is the number of connections the metrics and the probe listener hold (0 for one not
// started).
func (s *Server) Conns() (metrics, healthz int) { return s.metrics.held(), s.healthz.held() }

// Connection metrics of the listeners, named as kube-proxy and the agent name theirs
// (<namespace>_<subsystem>_<what>, _total for counters).
var (
	connsDesc = prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, "server", "connections"),
		"Connections the listener holds (accepted and not closed): against its maxConns cap.", []string{"listener"}, nil)
	connsClosedDesc = prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, "server", "connections_closed_total"),
		"Connections the listener closed at a cap: source-cap (a new one of a source at maxConnsPerSource), listener-cap (a new one at maxConns), evicted (an idle one closed to admit a new one).",
		[]string{"listener", "reason"}, nil)
)

// connCollector exports the listeners' connection figures at each scrape (read under the limiter's
// lock, so a scrape costs no more than a probe).
type connCollector struct{ s *Server }

func (c connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connsDesc
	ch <- connsClosedDesc
}

func (c connCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range []*listener{c.s.metrics, c.s.healthz} {
		if l == nil || l.conns == nil {
			continue
		}
		held, closed := l.conns.stats()
		ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(held), l.name)
		for r, n := range closed {
			ch <- prometheus.MustNewConstMetric(connsClosedDesc, prometheus.CounterValue, float64(n), l.name, closeReasonNames[r])
		}
	}
}

func (l *listener) held() int {
	if l == nil || l.conns == nil {
		return 0
	}
	return l.conns.Held()
}

func (l *listener) address() string {
	if l == nil || l.ln == nil {
		return ""
	}
	return l.ln.Addr().String()
}

// Start listens on every address (so a busy port fails start-up) and serves in the background.
func (s *Server) Start(context.Context) error {
	for _, l := range []*listener{s.metrics, s.healthz} {
		if l == nil {
			continue
		}
		if err := l.start(s.log); err != nil {
			_ = s.Stop(context.Background())
			return err
		}
	}
	return nil
}

func (l *listener) start(log *slog.Logger) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("%s server: %w", l.name, err)
	}
	l.conns = newConnLimiter(ln, l.limits.MaxConns, l.limits.MaxConnsPerSource)
	ln = l.conns
	scheme := "http"
	if l.tls != nil {
		ln = tls.NewListener(ln, l.tls)
		scheme = "https"
	}
	l.ln = ln
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(l.name+" server stopped", "err", err)
		}
	}()
	log.Info("serving "+l.name, "address", ln.Addr().String(), "scheme", scheme)
	return nil
}

// Stop shuts the listeners down and waits for them.
func (s *Server) Stop(ctx context.Context) error {
	var errs []error
	for _, l := range []*listener{s.metrics, s.healthz} {
		if l == nil || l.ln == nil {
			continue
		}
		errs = append(errs, l.srv.Shutdown(ctx))
		<-l.done
		l.ln = nil
	}
	return errors.Join(errs...)
}
