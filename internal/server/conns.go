package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Source is the key under which a client is counted (connections per source, TokenReviews per
// source): its IPv4 address, or the /64 of its IPv6 address, since one host or Pod network usually
// has a whole /64 to pick addresses from (#41: 1,000 addresses of one /64 were 1,000 sources).
func Source(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	if addr.Is4() {
		return netip.PrefixFrom(addr, 32)
	}
	p, _ := addr.Prefix(IPv6SourcePrefix)
	return p
}

// IPv6SourcePrefix is the prefix length by which IPv6 clients are counted as one source.
const IPv6SourcePrefix = 64

// sourceOf is Source of a "host:port" (a RemoteAddr); an address that does not parse counts as one
// source of its own text's zero prefix, so it still falls under the listener's cap.
func sourceOf(hostport string) netip.Prefix {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return netip.Prefix{}
	}
	return Source(ap.Addr())
}

// connLimiter is the listener wrapper that bounds the connections a listener holds: at most
// perSource from one source (Source) and max in all. A source at its cap has its new connection
// closed at once (cheap, so that a flooder's re-dials do not hold up the accept queue in front of a
// kubelet probe). At the listener's cap, a connection of the sources holding the most is closed to
// admit the new one, the one idle the longest (no request in the handler: idle keep-alive, a TLS
// handshake or request head not finished), when that source holds more than the new one's;
// otherwise the new one is closed. So a source holding fewer than the most (the kubelet's, a
// scraper's: none) gets in, however many sources the flood is spread over (issue #63: with "at
// least two more", a flood from 500 sources left each holding 0 or 1, and a new source, holding
// none, was closed at once). A source refused at a cap in the last floodMemory is a flooder: its
// new connections are closed at once, without taking anyone's, so that flooding sources at equal
// shares do not take each other's connections in turn (each a TLS handshake more for the agent)
// while they re-dial.
//
// golang.org/x/net/netutil.LimitListener is not used: it stops accepting when full, so a kubelet
// probe then waits in the kernel's backlog behind idle connections until one times out (the
// starvation of #41), and it cannot count by source.
type connLimiter struct {
	net.Listener
	max, perSource int

	mu       sync.Mutex
	conns    map[*trackedConn]struct{}
	bySource map[netip.Prefix]int
	// refused: when each source was last refused at a cap (kept for floodMemory).
	refused map[netip.Prefix]time.Time
	// closed counts, per closeReason, the connections closed at a cap (guarded by mu).
	closed [closeReasons]uint64
}

// floodMemory is how long a source refused at a cap is taken for a flooder: while it re-dials
// within it, its connections are refused without taking anyone's. A kubelet probe or a scrape is
// refused only when every connection of the listener is serving a request at once.
const floodMemory = 10 * time.Second

// closeReason is why the limiter closed a connection at a cap (label of
// nnm_server_connections_closed_total).
type closeReason int

const (
	closedSourceCap   closeReason = iota // a new connection of a source at MaxConnsPerSource
	closedListenerCap                    // a new connection at MaxConns, nothing to evict for it
	closedEvicted                        // an idle connection closed to admit a new one
	closeReasons
)

var closeReasonNames = [closeReasons]string{"source-cap", "listener-cap", "evicted"}

func newConnLimiter(ln net.Listener, max, perSource int) *connLimiter {
	return &connLimiter{Listener: ln, max: max, perSource: perSource,
		conns: map[*trackedConn]struct{}{}, bySource: map[netip.Prefix]int{}, refused: map[netip.Prefix]time.Time{}}
}

// trackedConn is an accepted connection as the limiter counts it.
type trackedConn struct {
	net.Conn
	l      *connLimiter
	source netip.Prefix
	// Guarded by l.mu: counted says c is in l.conns; serving is the number of requests in the
	// handler; since is when the connection last stopped serving (or was accepted).
	counted bool
	serving int
	since   time.Time
	// served: the connection has answered a request (an idle one is a keep-alive); a connection that
	// has not is closed to make room only after those that have (its first request may be on its way).
	served bool
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	c.l.drop(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// drop counts c out (again: a no-op). Called with l.mu held.
func (l *connLimiter) drop(c *trackedConn) {
	if !c.counted {
		return
	}
	c.counted = false
	delete(l.conns, c)
	if l.bySource[c.source]--; l.bySource[c.source] <= 0 {
		delete(l.bySource, c.source)
	}
}

// Accept admits a connection, closing another one or refusing the new one at a cap.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &trackedConn{Conn: raw, l: l, source: sourceOf(raw.RemoteAddr().String()), since: time.Now()}
		evict, ok := l.admit(c)
		if evict != nil {
			_ = evict.Close()
		}
		if ok {
			return c, nil
		}
		_ = raw.Close()
	}
}

// admit counts c in, returning the connection to close to make room (nil: none); false: c is
// refused.
func (l *connLimiter) admit(c *trackedConn) (evict *trackedConn, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perSource > 0 && l.bySource[c.source] >= l.perSource {
		l.refuse(c.source, c.since)
		l.closed[closedSourceCap]++
		return nil, false
	}
	if l.max > 0 && len(l.conns) >= l.max {
		if last, ok := l.refused[c.source]; ok && c.since.Sub(last) < floodMemory {
			l.refuse(c.source, c.since)
			l.closed[closedListenerCap]++
			return nil, false
		}
		evict = l.victim()
		if evict == nil || l.bySource[evict.source] <= l.bySource[c.source] {
			l.refuse(c.source, c.since)
			l.closed[closedListenerCap]++
			return nil, false
		}
		l.drop(evict)
		l.closed[closedEvicted]++
	}
	c.counted = true
	l.conns[c] = struct{}{}
	l.bySource[c.source]++
	return evict, true
}

// refuse remembers that source was refused at now; it forgets the sources not refused within
// floodMemory when there are many. Called with l.mu held.
func (l *connLimiter) refuse(source netip.Prefix, now time.Time) {
	l.refused[source] = now
	if len(l.refused) <= 4*max(l.max, l.perSource, 64) {
		return
	}
	for s, t := range l.refused {
		if now.Sub(t) >= floodMemory {
			delete(l.refused, s)
		}
	}
}

// victim is the connection to close to make room: among those that serve no request, of the
// sources holding the most connections, one that has served a request before (an idle keep-alive)
// rather than one whose first request may be on its way, and of those the one idle the longest.
// Called with l.mu held.
func (l *connLimiter) victim() *trackedConn {
	var best *trackedConn
	for c := range l.conns {
		if c.serving > 0 {
			continue
		}
		if best == nil {
			best = c
			continue
		}
		nc, nb := l.bySource[c.source], l.bySource[best.source]
		switch {
		case nc != nb:
			if nc > nb {
				best = c
			}
		case c.served != best.served:
			if c.served {
				best = c
			}
		case c.since.Before(best.since):
			best = c
		}
	}
	return best
}

// Held is the number of connections the listener holds.
func (l *connLimiter) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// stats is Held and the closed counts, read at once.
func (l *connLimiter) stats() (held int, closed [closeReasons]uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns), l.closed
}

type connKey struct{}

// connContext is the http.Server's ConnContext: it remembers the tracked connection of a request.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if t, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, t)
	}
	return ctx
}

// serving marks the request's connection as serving while h runs, so that it is not closed to make
// room (its request head is complete; ReadTimeout and WriteTimeout bound it).
func serving(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*trackedConn)
		if c == nil {
			h.ServeHTTP(w, r)
			return
		}
		c.l.mu.Lock()
		c.serving++
		c.l.mu.Unlock()
		defer func() {
			c.l.mu.Lock()
			c.serving--
			c.served = true
			c.since = time.Now()
			c.l.mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}
