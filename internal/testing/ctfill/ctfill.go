// Package ctfill creates conntrack entries over netlink in the network namespace of the calling
// thread, for kernel tests and the memory measurement of stale-udp-conntrack (bench -conntrack): a
// table of a given size and mix without sending a packet. Never call it in the host's namespace.
//
// An entry is created as conntrack(8) -I --dst-nat does: the original tuple, its plain inverse as
// reply tuple, and CTA_NAT_DST, from which the kernel (nf_nat_setup_info) computes the NATed reply
// tuple and sets the DNAT status bit, exactly as for an entry made by a DNAT rule.
// github.com/ti-mo/conntrack's Flow cannot carry CTA_NAT_DST, so the message is built with
// github.com/ti-mo/netfilter.
package ctfill

import (
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Entry is one connection to create: Orig from Src to Dst; with DNATTo valid, destination-NATed
// to it (Reply.Src becomes DNATTo).
type Entry struct {
	Protocol uint8 // syscall.IPPROTO_UDP or IPPROTO_TCP
	Src, Dst netip.AddrPort
	DNATTo   netip.AddrPort
	// Timeout in seconds (default 600).
	Timeout uint32
}

// ctnetlink attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctNew         = 0
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaTimeout    = 7
	ctaNatDst     = 13
	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4
	ctaProtoNum   = 1
	ctaProtoSrc   = 2
	ctaProtoDst   = 3
	ctaNatV4Min   = 1
	ctaNatV4Max   = 2
	ctaNatProto   = 3
	ctaNatV6Min   = 4
	ctaNatV6Max   = 5
	ctaPNatMin    = 1
	ctaPNatMax    = 2

	statusSeenReply = 1 << 1
	statusAssured   = 1 << 2
	// The kernel marks a created entry confirmed before it applies CTA_STATUS, and refuses a
	// status that would clear that bit (EBUSY).
	statusConfirmed = 1 << 3
)

func tuple(t uint16, proto uint8, src, dst netip.AddrPort) netfilter.Attribute {
	s, d := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
	if src.Addr().Is6() {
		s, d = ctaIPv6Src, ctaIPv6Dst
	}
	return netfilter.Attribute{Type: t, Nested: true, Children: []netfilter.Attribute{
		{Type: ctaTupleIP, Nested: true, Children: []netfilter.Attribute{
			{Type: s, Data: src.Addr().AsSlice()}, {Type: d, Data: dst.Addr().AsSlice()}}},
		{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaProtoNum, Data: []byte{proto}},
			{Type: ctaProtoSrc, Data: netfilter.Uint16Bytes(src.Port())},
			{Type: ctaProtoDst, Data: netfilter.Uint16Bytes(dst.Port())}}},
	}}
}

func message(e Entry) (netlink.Message, error) {
	fam := netfilter.ProtoIPv4
	if e.Src.Addr().Is6() {
		fam = netfilter.ProtoIPv6
	}
	timeout := e.Timeout
	if timeout == 0 {
		timeout = 600
	}
	attrs := []netfilter.Attribute{
		tuple(ctaTupleOrig, e.Protocol, e.Src, e.Dst),
		tuple(ctaTupleReply, e.Protocol, e.Dst, e.Src),
		{Type: ctaTimeout, Data: netfilter.Uint32Bytes(timeout)},
		{Type: ctaStatus, Data: netfilter.Uint32Bytes(statusSeenReply | statusAssured | statusConfirmed)},
	}
	if e.DNATTo.IsValid() {
		lo, hi := uint16(ctaNatV4Min), uint16(ctaNatV4Max)
		if e.DNATTo.Addr().Is6() {
			lo, hi = ctaNatV6Min, ctaNatV6Max
		}
		ip := e.DNATTo.Addr().AsSlice()
		attrs = append(attrs, netfilter.Attribute{Type: ctaNatDst, Nested: true, Children: []netfilter.Attribute{
			{Type: lo, Data: ip}, {Type: hi, Data: ip},
			{Type: ctaNatProto, Nested: true, Children: []netfilter.Attribute{
				{Type: ctaPNatMin, Data: netfilter.Uint16Bytes(e.DNATTo.Port())},
				{Type: ctaPNatMax, Data: netfilter.Uint16Bytes(e.DNATTo.Port())}}},
		}})
	}
	return netfilter.MarshalNetlink(netfilter.Header{SubsystemID: netfilter.NFSubsysCTNetlink, MessageType: ctNew,
		Family: fam, Flags: netlink.Request | netlink.Create | netlink.Excl | netlink.Acknowledge}, attrs)
}

// Create creates the entries produced by next (called with 0, 1, ... n-1) in the calling thread's
// network namespace, in batches of one socket write each, and returns the first error.
func Create(n int, next func(i int) Entry) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("ctfill: open netlink: %w", err)
	}
	defer c.Close()
	const batch = 256
	msgs := make([]netlink.Message, 0, batch)
	for i := 0; i < n; i += batch {
		msgs = msgs[:0]
		for j := i; j < min(n, i+batch); j++ {
			m, err := message(next(j))
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		sent, err := c.SendMessages(msgs)
		if err != nil {
			return fmt.Errorf("ctfill: send: %w", err)
		}
		for acks := 0; acks < len(sent); {
			got, err := c.Receive()
			if err != nil {
				return fmt.Errorf("ctfill: create entry %d..%d: %w", i, i+len(sent)-1, err)
			}
			acks += len(got)
		}
	}
	return nil
}

// Protocols for Entry.Protocol.
const (
	UDP = syscall.IPPROTO_UDP
	TCP = syscall.IPPROTO_TCP
)
