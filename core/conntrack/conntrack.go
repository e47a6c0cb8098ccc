// Package conntrack is the core's seam to the kernel's connection-tracking table, for fixes that
// repair conntrack state (stale-udp-conntrack). Fixes get an Interface injected; unit tests use
// NewFake, kernel tests the real table of a network namespace.
//
// The real implementation talks ctnetlink through github.com/ti-mo/conntrack, a maintained pure-Go
// library on github.com/mdlayher/netlink (already the agent's netlink library). Unlike
// github.com/vishvananda/netlink's ConntrackTableList, which dumps the whole table of a family and
// filters in user space (the memory blow-up of kubernetes#129982), its DumpFilter lets the kernel
// filter the dump, here by family and by the DNAT status bit, so only destination-NATed entries cross
// the socket. Deletions are one netlink request per entry (no exec), bounded by the caller.
package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Tuple is one direction of a connection.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// Entry is one conntrack entry. For a destination-NATed connection, Reply.Src is the DNAT target
// (where the packets really go).
type Entry struct {
	Family   rules.Family
	Protocol rules.Protocol // "" for protocols other than tcp, udp and sctp
	Orig     Tuple
	Reply    Tuple
	Zone     uint16
	// ID is the kernel's id of the entry: a delete of an entry that was replaced meanwhile (same
	// tuples, new id) fails instead of deleting the new one.
	ID uint32
}

func (e Entry) String() string {
	return fmt.Sprintf("%s %s %s -> %s (reply from %s)", e.Family, e.Protocol, e.Orig.Src, e.Orig.Dst, e.Reply.Src)
}

// Interface reads and deletes conntrack entries.
type Interface interface {
	// ListDNAT returns the entries of family whose destination was NATed. The kernel filters the
	// dump (family, DNAT status); nothing else is read.
	ListDNAT(ctx context.Context, family rules.Family) ([]Entry, error)
	// Delete deletes entries; an entry that is already gone is not an error. It returns how many it
	// deleted.
	Delete(ctx context.Context, entries []Entry) (int, error)
}

// Netlink is the Interface on the kernel's table, in the network namespace of the calling thread
// (each call opens its own netlink socket).
type Netlink struct{}

var _ Interface = Netlink{}

// New returns the netlink implementation.
func New() Netlink { return Netlink{} }

func protoFamily(f rules.Family) netfilter.ProtoFamily {
	if f == rules.IPv6 {
		return netfilter.ProtoIPv6
	}
	return netfilter.ProtoIPv4
}

var protocols = map[uint8]rules.Protocol{syscall.IPPROTO_TCP: rules.TCP, syscall.IPPROTO_UDP: rules.UDP, syscall.IPPROTO_SCTP: rules.SCTP}

// ListDNAT implements Interface.
func (Netlink) ListDNAT(ctx context.Context, family rules.Family) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := ct.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack: open netlink: %w", err)
	}
	defer c.Close()
	filter := ct.NewFilter().Family(protoFamily(family)).Status(ct.StatusDstNAT).StatusMask(uint32(ct.StatusDstNAT))
	flows, err := c.DumpFilter(filter, nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack: dump %s DNAT entries: %w", family, err)
	}
	out := make([]Entry, 0, len(flows))
	for _, f := range flows {
		if !family.Contains(f.TupleOrig.IP.SourceAddress) || f.Status&ct.StatusDstNAT == 0 {
			continue // a kernel without status filtering returned more than asked
		}
		out = append(out, Entry{
			Family:   family,
			Protocol: protocols[f.TupleOrig.Proto.Protocol],
			Orig:     tuple(f.TupleOrig),
			Reply:    tuple(f.TupleReply),
			Zone:     f.Zone,
			ID:       f.ID,
		})
	}
	return out, nil
}

func tuple(t ct.Tuple) Tuple {
	return Tuple{
		Src: netip.AddrPortFrom(t.IP.SourceAddress.Unmap(), t.Proto.SourcePort),
		Dst: netip.AddrPortFrom(t.IP.DestinationAddress.Unmap(), t.Proto.DestinationPort),
	}
}

func ctTuple(t Tuple, proto rules.Protocol, zone uint16) ct.Tuple {
	var num uint8
	for n, p := range protocols {
		if p == proto {
			num = n
		}
	}
	return ct.Tuple{
		IP:    ct.IPTuple{SourceAddress: t.Src.Addr(), DestinationAddress: t.Dst.Addr()},
		Proto: ct.ProtoTuple{Protocol: num, SourcePort: t.Src.Port(), DestinationPort: t.Dst.Port()},
		Zone:  zone,
	}
}

// Delete implements Interface.
func (Netlink) Delete(ctx context.Context, entries []Entry) (int, error) {
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
