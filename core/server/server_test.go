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
	var health, ready error = nil, errors.New("watches have not synced yet")
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
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "not synced") {
		t.Fatalf("/readyz = %d %q, want 503 naming the reason", code, body)
	}
	health = errors.New("fix invalid-drop: no successful sync")
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
