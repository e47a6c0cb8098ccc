package main

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"time"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// serve listens on TCP port 80 of every address of the server namespace (IPv4 and IPv6, the
// Service CIDRs included by their local routes) and accepts and closes connections until stop is
// closed. The SYN-ACK that the probe times is sent by the kernel; accepting only keeps the
// backlog from filling.
func (l *lab) serve(stop <-chan struct{}) (<-chan error, error) {
	var fd int
	err := netns.Do(netns.Path(l.server), func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: 80}); err != nil {
			return err
		}
		return unix.Listen(fd, 65535)
	})
	if err != nil {
		return nil, fmt.Errorf("server listener: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		<-stop
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
	}()
	go func() {
		defer unix.Close(fd)
		for {
			c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			if err != nil {
				select {
				case <-stop:
					done <- nil
				default:
					if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
						continue
					}
					done <- err
				}
				return
			}
			unix.Close(c)
		}
	}()
	return done, nil
}

// probe is one measurement: n new TCP connections, one at a time from one thread inside namespace
// ns, to dst(i) port 80. Each is timed from just before connect(2) to the moment poll(2) reports
// the handshake done (the SYN-ACK, made by the server's kernel, came back through the node); the
// socket is then closed with a RST (SO_LINGER 0), so no TIME_WAIT holds the client's ports.
type probe struct {
	lat  []time.Duration // sorted
	wall time.Duration   // the connections' whole time, sockets made and closed included: the connection rate's base
}

func (p probe) pct(q float64) time.Duration {
	if len(p.lat) == 0 {
		return 0
	}
	i := int(q/100*float64(len(p.lat))+0.5) - 1
	return p.lat[max(0, min(i, len(p.lat)-1))]
}

// rate is new connections per second from the one thread.
func (p probe) rate() float64 { return float64(len(p.lat)) / p.wall.Seconds() }

// warmup connections run before each measurement and are not counted.
const warmup = 200

func connectOnce(dst netip.Addr) (time.Duration, error) {
	af := unix.AF_INET
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Port: 80, Addr: dst.As4()}
	} else {
		af = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: 80, Addr: dst.As16()}
	}
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	t0 := time.Now()
	err = unix.Connect(fd, sa)
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return 0, fmt.Errorf("connect %s: %w", dst, err)
	}
	if err != nil {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		for {
			n, err := unix.Poll(pfd, 2000)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return 0, err
			}
			if n == 0 {
				return 0, fmt.Errorf("connect %s: no answer in 2 s", dst)
			}
			break
		}
	}
	d := time.Since(t0)
	if e, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
		return 0, fmt.Errorf("connect %s: %v %v", dst, unix.Errno(e), err)
	}
	return d, nil
}

// runPair measures n connections from namespace ns[0] to dst[0](i) and n from ns[1] to dst[1](i),
// alternating connection by connection (which side goes first alternates too), from one thread:
// both sides see the same moments of the machine's load. A socket belongs to the namespace it is
// made in; the thread switches namespace between connections, outside the timed part. The
// destinations are computed before the first connection: the connection rate is the kernel's and
// the probe's, not the address plan's (the i-th scattered IPv4 External-IP takes a loop over i).
func runPair(ns [2]string, n int, dst [2]func(i int) netip.Addr) ([2]probe, error) {
	var p [2]probe
	var to [2][]netip.Addr
	for side := range 2 {
		to[side] = make([]netip.Addr, n+warmup)
		for i := range to[side] {
			to[side][i] = dst[side](i)
		}
	}
	err := netns.Do(netns.Path(ns[0]), func() error {
		var hs [2]vnetns.NsHandle
		for i := range hs {
			h, err := vnetns.GetFromPath(netns.Path(ns[i]))
			if err != nil {
				return err
			}
			defer h.Close()
			hs[i] = h
		}
		one := func(side, i int) (time.Duration, error) {
			if err := vnetns.Set(hs[side]); err != nil {
				return 0, err
			}
			return connectOnce(to[side][i])
		}
		for i := range warmup {
			for side := range 2 {
				if _, err := one(side, n+i); err != nil {
					return err
				}
			}
		}
		runtime.GC()
		var wall [2]time.Duration
		for side := range 2 {
			p[side].lat = make([]time.Duration, n)
		}
		for i := range n {
			for k := range 2 {
				side := (i + k) % 2
				t0 := time.Now()
				d, err := one(side, i)
				if err != nil {
					return fmt.Errorf("side %d: %w", side, err)
				}
				wall[side] += time.Since(t0)
				p[side].lat[i] = d
			}
		}
		for side := range 2 {
			p[side].wall = wall[side]
		}
		return nil
	})
	for side := range 2 {
		slices.Sort(p[side].lat)
	}
	return p, err
}
