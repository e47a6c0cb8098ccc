// The seam to the kernel's connection-tracking table, for fixes that repair conntrack state
// (stale-udp-conntrack). Fixes get a Conntrack injected; unit tests use
// NewFakeConntrack, kernel tests the real table of a network namespace.
//
// The real implementation talks ctnetlink through github.com/ti-mo/conntrack, a maintained pure-Go
// library on github.com/mdlayher/netlink (already the agent's netlink library). Unlike
// github.com/vishvananda/netlink's ConntrackTableList, which dumps the whole table of a family and
// filters in user space (the memory blow-up of kubernetes#129982), its DumpFilter lets the kernel
// filter the dump, here by family, by the layer-4 protocol and by the DNAT status bit, so only the
// destination-NATed entries of one protocol cross the socket, and they are handed on one at a time
// as they arrive (EachDNAT). Deletions are one netlink request per entry (no exec), bounded by the
// caller.

package nodestate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// ConntrackTuple is one direction of a connection.
type ConntrackTuple struct {
	Src, Dst netip.AddrPort
}

// ConntrackEntry is one conntrack entry. For a destination-NATed connection, Reply.Src is the DNAT target
// (where the packets really go).
type ConntrackEntry struct {
	Family   rules.Family
	Protocol rules.Protocol // "" for protocols other than tcp, udp and sctp
	Orig     ConntrackTuple
	Reply    ConntrackTuple
	Zone     uint16
	// ID is the kernel's id of the entry: a delete of an entry that was replaced meanwhile (same
	// tuples, new id) fails instead of deleting the new one.
	ID uint32
}

func (e ConntrackEntry) String() string {
	return fmt.Sprintf("%s %s %s -> %s (reply from %s)", e.Family, e.Protocol, e.Orig.Src, e.Orig.Dst, e.Reply.Src)
}

// Conntrack reads and deletes conntrack entries.
type Conntrack interface {
	// EachDNAT hands fn, one at a time as the kernel's dump delivers them, the entries of family and
	// protocol whose destination was NATed, and stops when fn returns false. The kernel filters the
	// dump (family, protocol, DNAT status); nothing is held beyond the entry handed to fn, so memory
	// does not grow with the table.
	EachDNAT(ctx context.Context, family rules.Family, protocol rules.Protocol, fn func(ConntrackEntry) bool) error
	// Delete deletes entries; an entry that is already gone is not an error. It returns how many it
	// deleted.
	Delete(ctx context.Context, entries []ConntrackEntry) (int, error)
}

// NetlinkConntrack is the Conntrack on the kernel's table, in the network namespace of the calling thread
// (each call opens its own netlink socket).
type NetlinkConntrack struct{}

var _ Conntrack = NetlinkConntrack{}

// New returns the netlink implementation.
func NewConntrack() NetlinkConntrack { return NetlinkConntrack{} }

func protoFamily(f rules.Family) netfilter.ProtoFamily {
	if f == rules.IPv6 {
		return netfilter.ProtoIPv6
	}
	return netfilter.ProtoIPv4
}

var protocols = map[uint8]rules.Protocol{syscall.IPPROTO_TCP: rules.TCP, syscall.IPPROTO_UDP: rules.UDP, syscall.IPPROTO_SCTP: rules.SCTP}

func protoNumber(p rules.Protocol) uint8 {
	for n, q := range protocols {
		if q == p {
			return n
		}
	}
	return 0
}

// ctnetlink attributes and values the dump request needs that github.com/ti-mo/conntrack does not
// expose (linux/netfilter/nfnetlink_conntrack.h; the filter flags are in net/netfilter/nf_internals.h,
// part of the ABI, and libnetfilter_conntrack uses the same values).
const (
	ctGet             = 1  // IPCTNL_MSG_CT_GET
	ctaTupleOrig      = 1  // CTA_TUPLE_ORIG
	ctaTupleProto     = 2  // CTA_TUPLE_PROTO, in a tuple
	ctaProtoNum       = 1  // CTA_PROTO_NUM, in CTA_TUPLE_PROTO
	ctaStatus         = 3  // CTA_STATUS
	ctaFilter         = 25 // CTA_FILTER (Linux 5.8)
	ctaFilterOrig     = 1  // CTA_FILTER_ORIG_FLAGS, in CTA_FILTER
	ctaStatusMask     = 26 // CTA_STATUS_MASK (Linux 5.15)
	filterFlagProtoNr = 1 << 3
)

// dumpRequest asks the kernel for the entries of family and protocol with the DNAT status bit.
func dumpRequest(family rules.Family, protocol rules.Protocol) (netlink.Message, error) {
	flags := make([]byte, 4)
	binary.NativeEndian.PutUint32(flags, filterFlagProtoNr) // a host-order NLA_U32
	return netfilter.MarshalNetlink(netfilter.Header{
		SubsystemID: netfilter.NFSubsysCTNetlink,
		MessageType: ctGet,
		Family:      protoFamily(family),
		Flags:       netlink.Request | netlink.Dump,
	}, []netfilter.Attribute{
		{Type: ctaStatus, Data: netfilter.Uint32Bytes(uint32(ct.StatusDstNAT))},
		{Type: ctaStatusMask, Data: netfilter.Uint32Bytes(uint32(ct.StatusDstNAT))},
		{Type: ctaTupleOrig, Nested: true, Children: []netfilter.Attribute{
			{Type: ctaTupleProto, Nested: true, Children: []netfilter.Attribute{{Type: ctaProtoNum, Data: []byte{protoNumber(protocol)}}}},
		}},
		{Type: ctaFilter, Nested: true, Children: []netfilter.Attribute{{Type: ctaFilterOrig, Data: flags}}},
	})
}

// EachDNAT implements Conntrack. github.com/ti-mo/conntrack's DumpFilter collects the whole dump
// before returning it and cannot filter by protocol; so the request is built here (with
// github.com/ti-mo/netfilter), read as a stream with mdlayher/netlink's ReceiveIter, and each
// message decoded by ti-mo/conntrack.
func (NetlinkConntrack) EachDNAT(ctx context.Context, family rules.Family, protocol rules.Protocol, fn func(ConntrackEntry) bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if protoNumber(protocol) == 0 {
		return fmt.Errorf("conntrack: dump: unknown protocol %q", protocol)
	}
	req, err := dumpRequest(family, protocol)
	if err != nil {
		return fmt.Errorf("conntrack: dump %s %s DNAT entries: %w", family, protocol, err)
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("conntrack: open netlink: %w", err)
	}
	// Closing the socket ends a dump that fn stopped early, without reading the rest.
	defer c.Close()
	if _, err := c.Send(req); err != nil {
		return fmt.Errorf("conntrack: dump %s %s DNAT entries: %w", family, protocol, err)
	}
	for m, err := range c.ReceiveIter() {
		if err != nil {
			return fmt.Errorf("conntrack: dump %s %s DNAT entries: %w", family, protocol, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var ev ct.Event
		if err := ev.Unmarshal(m); err != nil || ev.Flow == nil {
			return fmt.Errorf("conntrack: dump %s %s DNAT entries: decode: %v", family, protocol, err)
		}
		f := ev.Flow
		// A kernel that ignores a filter attribute (older than 5.8 or 5.15) returns more than asked.
		if !family.Contains(f.TupleOrig.IP.SourceAddress) || f.Status&ct.StatusDstNAT == 0 ||
			protocols[f.TupleOrig.Proto.Protocol] != protocol {
			continue
		}
		if !fn(ConntrackEntry{Family: family, Protocol: protocol, Orig: tuple(f.TupleOrig), Reply: tuple(f.TupleReply), Zone: f.Zone, ID: f.ID}) {
			return nil
		}
	}
	return nil
}

func tuple(t ct.Tuple) ConntrackTuple {
	return ConntrackTuple{
		Src: netip.AddrPortFrom(t.IP.SourceAddress.Unmap(), t.Proto.SourcePort),
		Dst: netip.AddrPortFrom(t.IP.DestinationAddress.Unmap(), t.Proto.DestinationPort),
	}
}

func ctTuple(t ConntrackTuple, proto rules.Protocol, zone uint16) ct.Tuple {
	num := protoNumber(proto)
	return ct.Tuple{
		IP:    ct.IPTuple{SourceAddress: t.Src.Addr(), DestinationAddress: t.Dst.Addr()},
		Proto: ct.ProtoTuple{Protocol: num, SourcePort: t.Src.Port(), DestinationPort: t.Dst.Port()},
		Zone:  zone,
	}
}

// Delete implements Conntrack.
func (NetlinkConntrack) Delete(ctx context.Context, entries []ConntrackEntry) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	c, err := ct.Dial(nil)
	if err != nil {
		return 0, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	defer c.Close()
	n := 0
	var errs []error
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if e.Protocol == "" {
			errs = append(errs, fmt.Errorf("conntrack: delete %s: unknown protocol", e))
			continue
		}
		f := ct.Flow{ID: e.ID, Zone: e.Zone, TupleOrig: ctTuple(e.Orig, e.Protocol, e.Zone), TupleReply: ctTuple(e.Reply, e.Protocol, e.Zone)}
		if err := c.Delete(f); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				continue // gone already (timed out, or replaced by an entry with a new id)
			}
			errs = append(errs, fmt.Errorf("conntrack: delete %s: %w", e, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
