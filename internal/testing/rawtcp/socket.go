package rawtcp

import (
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/internal/testing/recvloop"
)

// Send sends one segment through a raw socket opened in the calling thread's network namespace.
// IPv4 uses IPPROTO_RAW (IP_HDRINCL: the packet is built here); IPv6 uses an IPPROTO_TCP raw socket
// bound to the source address, the kernel adds the IPv6 header and the checksum is computed here.
func Send(s Segment) error {
	if err := s.check(); err != nil {
		return err
	}
	if s.Src.Addr().Is4() {
		pkt, err := s.MarshalIPv4()
		if err != nil {
			return err
		}
		return sendIPv4(pkt, s)
	}
	tcp, err := s.MarshalTCP()
	if err != nil {
		return err
	}
	return sendIPv6(tcp, s)
}

// sendIPv4 sends a complete IPv4 packet to s.Dst.
func sendIPv4(pkt []byte, s Segment) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("rawtcp: raw IPv4 socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: s.Dst.Addr().As4()}); err != nil {
		return fmt.Errorf("rawtcp: send %s: %w", s, err)
	}
	return nil
}

// sendIPv6 sends a TCP segment from s.Src to s.Dst; the kernel adds the IPv6 header.
func sendIPv6(tcp []byte, s Segment) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return fmt.Errorf("rawtcp: raw IPv6 socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: s.Src.Addr().As16()}); err != nil {
		return fmt.Errorf("rawtcp: bind raw IPv6 socket to %s: %w", s.Src.Addr(), err)
	}
	if err := unix.Sendto(fd, tcp, 0, &unix.SockaddrInet6{Addr: s.Dst.Addr().As16()}); err != nil {
		return fmt.Errorf("rawtcp: send %s: %w", s, err)
	}
	return nil
}

// Packet is one captured TCP packet.
type Packet struct {
	Segment
	// Outgoing is true for packets the capturing host sent, false for packets it received.
	Outgoing bool
	Time     time.Time
}

func (p Packet) String() string {
	dir := "in "
	if p.Outgoing {
		dir = "out"
	}
	return dir + " " + p.Segment.String()
}

// Capture records every TCP packet (IPv4 and IPv6) that crosses one interface, in both directions.
type Capture struct {
	fd      int
	ifindex int
	done    chan struct{}
	stop    chan struct{}

	mu      sync.Mutex
	packets []Packet
	err     error
}

// NewCapture starts capturing on the interface ifname of the calling thread's network namespace.
func NewCapture(ifname string) (*Capture, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("rawtcp: capture: %w", err)
	}
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return nil, fmt.Errorf("rawtcp: AF_PACKET socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rawtcp: bind capture to %s: %w", ifname, err)
	}
	// Short receive timeout, so that Close is noticed by the reading goroutine.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rawtcp: capture timeout: %w", err)
	}
	c := &Capture{fd: fd, ifindex: ifi.Index, done: make(chan struct{}), stop: make(chan struct{})}
	go c.run()
	return c, nil
}

func (c *Capture) run() {
	defer close(c.done)
	recvloop.Run(c.fd, make([]byte, 65536), c.stop, func(msg []byte, from unix.Sockaddr, err error) bool {
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return false
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Ifindex != c.ifindex { // packets queued before bind
			return true
		}
		seg, ok := ParseIP(msg)
		if !ok {
			return true
		}
		p := Packet{Segment: seg, Outgoing: ll.Pkttype == unix.PACKET_OUTGOING, Time: time.Now()}
		c.mu.Lock()
		c.packets = append(c.packets, p)
		c.mu.Unlock()
		return true
	})
}

// Packets returns a copy of what was captured so far, oldest first.
func (c *Capture) Packets() []Packet {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Packet(nil), c.packets...)
}

// Filter returns the captured packets for which match is true.
func (c *Capture) Filter(match func(Packet) bool) []Packet {
	var out []Packet
	for _, p := range c.Packets() {
		if match(p) {
			out = append(out, p)
		}
	}
	return out
}

// Err is the error that ended the capture early, if any.
func (c *Capture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close stops capturing and closes the socket; the packets stay readable. It is safe to call twice.
func (c *Capture) Close() error {
	select {
	case <-c.stop:
		return nil
	default:
	}
	close(c.stop)
	<-c.done
	return unix.Close(c.fd)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
