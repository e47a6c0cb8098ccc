package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// One IPv6 /64 is one source; an IPv4 address (also written IPv4-mapped) is one source.
func TestSource(t *testing.T) {
	for _, tc := range []struct{ hostport, want string }{
		{"10.0.0.1:80", "10.0.0.1/32"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1/32"},
		{"[fd00:41::1]:80", "fd00:41::/64"},
		{"[fd00:41::ffff:1:2]:443", "fd00:41::/64"},
		{"[fd00:41:0:1::1]:443", "fd00:41:0:1::/64"},
		{"[fe80::1%eth0]:80", "fe80::/64"},
	} {
		if got := sourceOf(tc.hostport); got != netip.MustParsePrefix(tc.want) {
			t.Errorf("sourceOf(%s) = %s, want %s", tc.hostport, got, tc.want)
		}
	}
	if got := sourceOf("not an address"); got.IsValid() {
		t.Errorf("sourceOf(garbage) = %s, want the zero prefix", got)
	}
}

// TestConnectionMetrics: nnm_server_connections{listener} follows the connections each listener
// holds, and nnm_server_connections_closed_total{listener,reason} counts those closed at a cap: a
// source at its cap, and idle ones evicted for a new source at the listener's cap.
func TestConnectionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Options{MetricsAddress: "127.0.0.1:0", HealthzAddress: "127.0.0.1:0",
		Limits: Limits{MaxConns: 4, MaxConnsPerSource: 3, ReadHeaderTimeout: time.Minute, IdleTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxHeaderBytes: 4 << 10}},
		reg, Checks{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	value := func(name string, labels ...string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
		metric:
			for _, m := range mf.GetMetric() {
				for i := 0; i < len(labels); i += 2 {
					found := false
					for _, lp := range m.GetLabel() {
						found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
					}
					if !found {
						continue metric
					}
				}
				if g := m.GetGauge(); g != nil {
					return g.GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return 0
	}
	dialN := func(addr string, n int) []net.Conn {
		var cs []net.Conn
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
		return cs
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		err := agenttest.Poll(t.Context(), 5*time.Second, 10*time.Millisecond, func() error {
			if !cond() {
				return errors.New(what + ": never")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Five idle connections from 127.0.0.1 to the probe listener: three held, two refused.
	conns := dialN(s.HealthzAddr(), 5)
	until("3 held", func() bool {
		return value("nnm_server_connections", "listener", "healthz") == 3 &&
			value("nnm_server_connections_closed_total", "listener", "healthz", "reason", "source-cap") == 2
	})
	if v := value("nnm_server_connections", "listener", "metrics"); v != 0 {
		t.Errorf("metrics listener holds %v connections, want 0", v)
	}
	// Another source (127.0.0.2) fills the listener's cap and then evicts an idle one of 127.0.0.1.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range 2 {
		c, err := d.Dial("tcp", s.HealthzAddr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	until("one evicted", func() bool {
		return value("nnm_server_connections", "listener", "healthz") == 4 &&
			value("nnm_server_connections_closed_total", "listener", "healthz", "reason", "evicted") == 1
	})
	for _, c := range conns {
		c.Close()
	}
	until("all closed", func() bool { return value("nnm_server_connections", "listener", "healthz") == 0 })
	testkit.Promlint(t, reg)
}

// The admission at the listener's cap: a source holding fewer than the source holding the most takes
// an idle connection of that source, a keep-alive before a connection that has served nothing;
// a source refused within floodMemory is refused again without taking anyone's, while one never
// refused still gets in.
func TestAdmitAtTheCap(t *testing.T) {
	l := newConnLimiter(nil, 3, 2)
	now := time.Unix(1000, 0)
	conn := func(src string) *trackedConn {
		now = now.Add(time.Second)
		return &trackedConn{l: l, source: netip.MustParsePrefix(src), since: now}
	}
	admit := func(c *trackedConn) (*trackedConn, bool) { return l.admit(c) }
	a1, b1, c1 := conn("10.0.0.1/32"), conn("10.0.0.2/32"), conn("10.0.0.3/32")
	for _, c := range []*trackedConn{a1, b1, c1} {
		if _, ok := admit(c); !ok {
			t.Fatal("refused below the cap")
		}
	}
	b1.served = true // b1 is an idle keep-alive; a1 and c1 wait for their first request
	// Every source holds one: a fourth source holding none takes b1 (served), not the older a1.
	d1 := conn("10.0.0.4/32")
	if evict, ok := admit(d1); !ok || evict != b1 {
		t.Fatalf("a new source at the cap: admitted %v, closing %v; want b1 closed", ok, evict)
	}
	// A source holding one, as many as the most, is refused, and taken for a flooder.
	a2 := conn("10.0.0.1/32")
	if _, ok := admit(a2); ok {
		t.Fatal("a source holding as many as the most took a connection")
	}
	// a's first connection goes; b, holding none, takes the free place. At the cap again, a,
	// refused within floodMemory, takes nothing, although it holds fewer than the most.
	l.drop(a1)
	if _, ok := admit(conn("10.0.0.2/32")); !ok {
		t.Fatal("b, holding none, was refused below the cap")
	}
	if _, ok := admit(conn("10.0.0.1/32")); ok {
		t.Fatal("a source refused within floodMemory took a connection")
	}
	now = now.Add(floodMemory)
	if _, ok := admit(conn("10.0.0.1/32")); !ok {
		t.Fatal("a source refused longer than floodMemory ago, holding none, was refused")
	}
}
