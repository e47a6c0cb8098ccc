// Package rawtcp crafts single TCP segments and sends them through raw sockets, and captures the TCP
// packets of one interface with an AF_PACKET socket. Dataplane tests use it to inject a segment into an
// established connection (IPv4 and IPv6) and to see which packets cross a link.
//
// Sockets are opened in the network namespace of the calling thread: call Send and NewCapture from
// inside netns.NS.Do. A Capture keeps reading in the background after Do returns; the socket stays
// bound to the namespace it was opened in.
package rawtcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// TCP header flags.
const (
	FIN uint8 = 0x01
	SYN uint8 = 0x02
	RST uint8 = 0x04
	PSH uint8 = 0x08
	ACK uint8 = 0x10
)

// Segment is one TCP segment with the addresses of the IP packet that carries it. Src and Dst must be
// of the same family.
type Segment struct {
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8
	Window   uint16
	// MSS is the maximum segment size option of a parsed segment (0 when absent). MarshalTCP does
	// not write options.
	MSS     uint16
	Payload []byte
}

// SeqEnd is the sequence number that follows the segment (SYN and FIN count as one byte).
func (s Segment) SeqEnd() uint32 {
	n := s.Seq + uint32(len(s.Payload))
	if s.Flags&SYN != 0 {
		n++
	}
	if s.Flags&FIN != 0 {
		n++
	}
	return n
}

// Has reports whether all of flags are set.
func (s Segment) Has(flags uint8) bool { return s.Flags&flags == flags }

func (s Segment) String() string {
	names := ""
	for _, f := range []struct {
		bit  uint8
		name string
	}{{SYN, "S"}, {FIN, "F"}, {RST, "R"}, {PSH, "P"}, {ACK, "."}} {
		if s.Flags&f.bit != 0 {
			names += f.name
		}
	}
	mss := ""
	if s.MSS != 0 {
		mss = fmt.Sprintf(" mss %d", s.MSS)
	}
	return fmt.Sprintf("%s > %s [%s] seq %d ack %d win %d%s len %d", s.Src, s.Dst, names, s.Seq, s.Ack, s.Window, mss, len(s.Payload))
}

func (s Segment) check() error {
	if !s.Src.Addr().IsValid() || !s.Dst.Addr().IsValid() {
		return errors.New("rawtcp: segment needs source and destination")
	}
	if s.Src.Addr().Is4() != s.Dst.Addr().Is4() {
		return fmt.Errorf("rawtcp: mixed families %s and %s", s.Src, s.Dst)
	}
	return nil
}

const tcpHeaderLen = 20

// MarshalTCP returns the TCP header (no options) and payload with the checksum computed over the
// pseudo-header of Src and Dst.
func (s Segment) MarshalTCP() ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	b := make([]byte, tcpHeaderLen+len(s.Payload))
	binary.BigEndian.PutUint16(b[0:], s.Src.Port())
	binary.BigEndian.PutUint16(b[2:], s.Dst.Port())
	binary.BigEndian.PutUint32(b[4:], s.Seq)
	binary.BigEndian.PutUint32(b[8:], s.Ack)
	b[12] = (tcpHeaderLen / 4) << 4
	b[13] = s.Flags
	binary.BigEndian.PutUint16(b[14:], s.Window)
	copy(b[tcpHeaderLen:], s.Payload)
	binary.BigEndian.PutUint16(b[16:], tcpChecksum(s.Src.Addr(), s.Dst.Addr(), b))
	return b, nil
}

// MarshalIPv4 returns an IPv4 packet (header without options, TTL 64, DF) carrying the segment.
func (s Segment) MarshalIPv4() ([]byte, error) {
	if !s.Src.Addr().Is4() {
		return nil, fmt.Errorf("rawtcp: %s is not IPv4", s.Src.Addr())
	}
	tcp, err := s.MarshalTCP()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 20+len(tcp))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	binary.BigEndian.PutUint16(b[6:], 0x4000) // DF
	b[8] = 64
	b[9] = 6 // TCP
	src, dst := s.Src.Addr().As4(), s.Dst.Addr().As4()
	copy(b[12:16], src[:])
	copy(b[16:20], dst[:])
	binary.BigEndian.PutUint16(b[10:], ^fold(sum(0, b[:20])))
	copy(b[20:], tcp)
	return b, nil
}

// tcpChecksum is the Internet checksum of the pseudo-header and the TCP segment (whose checksum field
// must be zero).
func tcpChecksum(src, dst netip.Addr, tcp []byte) uint16 { return ^fold(sumPseudo(src, dst, tcp)) }

func sum(acc uint32, b []byte) uint32 {
	for len(b) >= 2 {
		acc += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	return acc
}

func fold(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

// ParseIP parses an IPv4 or IPv6 packet that carries TCP (IPv6 without extension headers). It returns
// false for anything else.
func ParseIP(pkt []byte) (Segment, bool) {
	if len(pkt) < 1 {
		return Segment{}, false
	}
	var src, dst netip.Addr
	var tcp []byte
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 || pkt[9] != 6 {
			return Segment{}, false
		}
		ihl := int(pkt[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		if ihl < 20 || total < ihl || total > len(pkt) {
			return Segment{}, false
		}
		if binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 { // a fragment
			return Segment{}, false
		}
		src = netip.AddrFrom4([4]byte(pkt[12:16]))
		dst = netip.AddrFrom4([4]byte(pkt[16:20]))
		tcp = pkt[ihl:total]
	case 6:
		if len(pkt) < 40 || pkt[6] != 6 {
			return Segment{}, false
		}
		plen := int(binary.BigEndian.Uint16(pkt[4:]))
		if 40+plen > len(pkt) {
			return Segment{}, false
		}
		src = netip.AddrFrom16([16]byte(pkt[8:24]))
		dst = netip.AddrFrom16([16]byte(pkt[24:40]))
		tcp = pkt[40 : 40+plen]
	default:
		return Segment{}, false
	}
	return parseTCP(src, dst, tcp)
}

func parseTCP(src, dst netip.Addr, tcp []byte) (Segment, bool) {
	if len(tcp) < tcpHeaderLen {
		return Segment{}, false
	}
	off := int(tcp[12]>>4) * 4
	if off < tcpHeaderLen || off > len(tcp) {
		return Segment{}, false
	}
	return Segment{
		Src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:])),
		Dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:])),
		Seq:     binary.BigEndian.Uint32(tcp[4:]),
		Ack:     binary.BigEndian.Uint32(tcp[8:]),
		Flags:   tcp[13],
		Window:  binary.BigEndian.Uint16(tcp[14:]),
		MSS:     mssOption(tcp[tcpHeaderLen:off]),
		Payload: append([]byte(nil), tcp[off:]...),
	}, true
}

// mssOption finds the MSS option (kind 2, length 4) in the TCP options, or returns 0.
func mssOption(opts []byte) uint16 {
	for i := 0; i < len(opts); {
		switch kind := opts[i]; kind {
		case 0: // end of options
			return 0
		case 1: // no-op
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return 0
		}
		if opts[i] == 2 && opts[i+1] == 4 {
			return binary.BigEndian.Uint16(opts[i+2:])
		}
		i += int(opts[i+1])
	}
	return 0
}

// ChecksumOK reports whether the TCP checksum of a marshalled segment between src and dst is valid.
func ChecksumOK(src, dst netip.Addr, tcp []byte) bool {
	return fold(sumPseudo(src, dst, tcp)) == 0xffff
}

func sumPseudo(src, dst netip.Addr, tcp []byte) uint32 {
	var acc uint32
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		acc = sum(sum(acc, s[:]), d[:])
	} else {
		s, d := src.As16(), dst.As16()
		acc = sum(sum(acc, s[:]), d[:])
		acc += uint32(len(tcp) >> 16)
	}
	acc += 6 + uint32(len(tcp)&0xffff)
	return sum(acc, tcp)
}
