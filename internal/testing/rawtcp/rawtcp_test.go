package rawtcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// Test address plan: 192.0.2.0/24 and 2001:db8:9::/64 (documentation prefixes), only inside the test's
// own network namespaces.

func TestMarshalParseRoundTrip(t *testing.T) {
	for _, tc := range []struct{ src, dst string }{
		{"192.0.2.2:8080", "192.0.2.1:40000"},
		{"[2001:db8:9::2]:8080", "[2001:db8:9::1]:40000"},
	} {
		s := Segment{
			Src: netip.MustParseAddrPort(tc.src), Dst: netip.MustParseAddrPort(tc.dst),
			Seq: 0xfffffff0, Ack: 12345, Flags: ACK | PSH, Window: 502, Payload: []byte("odd"),
		}
		tcp, err := s.MarshalTCP()
		if err != nil {
			t.Fatal(err)
		}
		if !ChecksumOK(s.Src.Addr(), s.Dst.Addr(), tcp) {
			t.Errorf("%s: checksum does not verify", tc.src)
		}
		bad := bytes.Clone(tcp)
		bad[len(bad)-1] ^= 1
		if ChecksumOK(s.Src.Addr(), s.Dst.Addr(), bad) {
			t.Errorf("%s: a corrupted segment verifies", tc.src)
		}
		var pkt []byte
		if s.Src.Addr().Is4() {
			if pkt, err = s.MarshalIPv4(); err != nil {
				t.Fatal(err)
			}
			if fold(sum(0, pkt[:20])) != 0xffff {
				t.Errorf("IPv4 header checksum does not verify")
			}
		} else {
			pkt = make([]byte, 40+len(tcp))
			pkt[0] = 0x60
			binary.BigEndian.PutUint16(pkt[4:], uint16(len(tcp)))
			pkt[6], pkt[7] = 6, 64
			a, b := s.Src.Addr().As16(), s.Dst.Addr().As16()
			copy(pkt[8:], a[:])
			copy(pkt[24:], b[:])
			copy(pkt[40:], tcp)
		}
		got, ok := ParseIP(pkt)
		if !ok {
			t.Fatalf("%s: ParseIP failed", tc.src)
		}
		if got.String() != s.String() || !bytes.Equal(got.Payload, s.Payload) {
			t.Errorf("round trip:\n got %s\nwant %s", got, s)
		}
		if got.SeqEnd() != 0xfffffff3 {
			t.Errorf("SeqEnd = %d, want wrap-around to 0xfffffff3", got.SeqEnd())
		}
	}
	if _, err := (Segment{Src: netip.MustParseAddrPort("192.0.2.1:1"), Dst: netip.MustParseAddrPort("[2001:db8::1]:1")}).MarshalTCP(); err == nil {
		t.Error("mixed families accepted")
	}
}

// TestKernelAnswersCraftedSYN proves the checksums are right where it counts: a SYN sent with Send from
// one namespace is answered with a SYN-ACK by a listener's kernel in another (veth does not skip
// checksum validation of raw-socket packets), and the capture sees both. A corrupted SYN gets no answer.
func TestKernelAnswersCraftedSYN(t *testing.T) {
	netns.Require(t)
	a, b := netns.New(t, "nnmraw-a"), netns.New(t, "nnmraw-b")
	a.MustExec("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b.Name)
	for _, ns := range []*netns.NS{a, b} {
		ns.MustExec("sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.eth0.accept_dad=0")
		ns.MustExec("ip", "link", "set", "eth0", "up")
	}
	a.MustExec("ip", "addr", "add", "192.0.2.1/24", "dev", "eth0")
	a.MustExec("ip", "addr", "add", "2001:db8:9::1/64", "dev", "eth0", "nodad")
	b.MustExec("ip", "addr", "add", "192.0.2.2/24", "dev", "eth0")
	b.MustExec("ip", "addr", "add", "2001:db8:9::2/64", "dev", "eth0", "nodad")

	for _, tc := range []struct{ name, src, dst string }{
		{"ipv4", "192.0.2.1:40001", "192.0.2.2:8080"},
		{"ipv6", "[2001:db8:9::1]:40001", "[2001:db8:9::2]:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := netip.MustParseAddrPort(tc.dst)
			var ln net.Listener
			if err := b.Do(func() (err error) { ln, err = net.Listen("tcp", dst.String()); return }); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var c *Capture
			if err := a.Do(func() (err error) { c, err = NewCapture("eth0"); return }); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			send := func(port uint16, corrupt bool) []Packet {
				syn := Segment{Src: netip.AddrPortFrom(netip.MustParseAddrPort(tc.src).Addr(), port), Dst: dst, Seq: 1000, Flags: SYN, Window: 1024}
				err := a.Do(func() error {
					if !corrupt {
						return Send(syn)
					}
					return sendCorrupt(syn)
				})
				if err != nil {
					t.Fatal(err)
				}
				// An answer comes within a second; a corrupt SYN gets 300 ms to draw one.
				within := time.Second
				if corrupt {
					within = 300 * time.Millisecond
				}
				var synack []Packet
				_ = agenttest.Poll(t.Context(), within, 20*time.Millisecond, func() error {
					synack = c.Filter(func(p Packet) bool {
						return !p.Outgoing && p.Dst.Port() == port && p.Has(SYN|ACK) && p.Ack == 1001
					})
					if len(synack) == 0 {
						return errors.New("no SYN-ACK yet")
					}
					return nil
				})
				return synack
			}
			if got := send(40001, false); len(got) != 1 {
				t.Fatalf("want one SYN-ACK for the crafted SYN, got %v; captured: %v", got, c.Packets())
			}
			if got := send(40002, true); len(got) != 0 {
				t.Fatalf("a SYN with a wrong checksum was answered: %v", got)
			}
			out := c.Filter(func(p Packet) bool { return p.Outgoing && p.Has(SYN) && !p.Has(ACK) })
			if len(out) != 2 {
				t.Errorf("capture saw %d outgoing SYNs, want 2: %v", len(out), c.Packets())
			}
		})
	}
}

// sendCorrupt sends the segment with one bit of its TCP checksum flipped.
func sendCorrupt(s Segment) error {
	if s.Src.Addr().Is4() {
		pkt, err := s.MarshalIPv4()
		if err != nil {
			return err
		}
		pkt[20+16] ^= 0x01
		return sendIPv4(pkt, s)
	}
	tcp, err := s.MarshalTCP()
	if err != nil {
		return err
	}
	tcp[16] ^= 0x01
	return sendIPv6(tcp, s)
}

func TestMSSOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []byte
		want uint16
	}{
		{"linux syn", []byte{2, 4, 0x05, 0x50, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7}, 1360},
		{"after nops and timestamps", []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 2, 4, 0x05, 0xb4}, 1460},
		{"none", []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0}, 0},
		{"end of options first", []byte{0, 0, 2, 4, 5, 0xb4}, 0},
		{"truncated", []byte{2, 4, 5}, 0},
		{"zero length", []byte{3, 0, 2, 4, 5, 0xb4}, 0},
	} {
		if got := mssOption(tc.opts); got != tc.want {
			t.Errorf("%s: mssOption = %d, want %d", tc.name, got, tc.want)
		}
	}
}
