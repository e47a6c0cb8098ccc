package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/internal/engine"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProbesAndMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nnm_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var health, ready error = nil, &engine.ProbeError{Summary: "fix x (ipv4): no successful sync yet", Err: engine.ErrWaitingForWatches}
	s := New(Options{MetricsAddress: "127.0.0.1:0"}, reg, Checks{Healthy: func() error { return health }, Ready: func() error { return ready }},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	base := "http://" + s.Addr()

	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "waiting for the watches") {
		t.Fatalf("/readyz = %d %q, want 503 naming the reason", code, body)
	}
	health = &engine.ProbeError{Summary: "fix invalid-drop (ipv4): no successful sync", Err: errors.New("boom")}
	if code, body := get(t, base+"/healthz"); code != 503 || !strings.Contains(body, "invalid-drop") {
		t.Fatalf("/healthz = %d %q, want 503 naming the fix", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "nnm_test_total 3") {
		t.Fatalf("/metrics = %d %q", code, body)
	}
}

func TestBusyPortFailsStart(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := New(Options{MetricsAddress: "127.0.0.1:0"}, prometheus.NewRegistry(), Checks{}, log)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer a.Stop(context.Background())
	b := New(Options{MetricsAddress: a.Addr()}, prometheus.NewRegistry(), Checks{}, log)
	if err := b.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "metrics server") {
		t.Fatalf("want an error naming the metrics server, got %v", err)
	}
}

func TestDisabled(t *testing.T) {
	s := New(Options{}, prometheus.NewRegistry(), Checks{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background()); err != nil || s.Addr() != "" {
		t.Fatalf("an empty address must disable the server: %v %q", err, s.Addr())
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// The probes answer unauthenticated (hostNetwork: reachable from every pod), so a failure shows the
// fix, the family and the kind of problem, never the error's text, which can hold host paths (#19);
// the whole error goes to the log, once per change.
func TestProbesAnswerShortAndLogTheDetails(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	detail := errors.New("iptables-restore: exit status 4: Another app is currently holding the xtables lock; /run/xtables.lock")
	health := errors.Join(
		&engine.ProbeError{Summary: "fix invalid-drop (ipv4): no successful sync for 1m5s (limit 1m0s)", Err: detail},
		&engine.ProbeError{Summary: "fix ipvs-externalip-dnat (ipv6): no successful sync for 1m5s (limit 1m0s)", Err: engine.ErrWaitingForWatches},
		errors.New("worker stuck reading /etc/secret/path"))
	s := New(Options{MetricsAddress: "127.0.0.1:0", HealthzAddress: "127.0.0.1:0"}, prometheus.NewRegistry(),
		Checks{Healthy: func() error { return health }}, log)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	want := "not ok: fix invalid-drop (ipv4): no successful sync for 1m5s (limit 1m0s): the last sync failed (the error is in the agent's log, the count in nnm_sync_errors_total)\n" +
		"fix ipvs-externalip-dnat (ipv6): no successful sync for 1m5s (limit 1m0s): waiting for the watches it reads to sync (see the API errors logged)\n" +
		"failing (the details are in the agent's log)\n"
	for range 3 {
		code, body := get(t, "http://"+s.HealthzAddr()+"/healthz")
		if code != 503 || body != want {
			t.Fatalf("/healthz = %d\n%s\nwant 503\n%s", code, body, want)
		}
	}
	if n := strings.Count(logs.String(), "/run/xtables.lock"); n != 1 {
		t.Errorf("the detail is logged %d times after three identical probes, want once:\n%s", n, logs.String())
	}
}
