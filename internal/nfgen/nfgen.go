// Package nfgen reads the generation id of the nf_tables ruleset (NFT_MSG_GETGEN): a counter of the
// network namespace's whole nf_tables ruleset that every committed transaction bumps, whoever sent
// it (nft, iptables-nft, kube-proxy, us). Two equal readings mean nothing in nf_tables changed in
// between, so a backend that recorded the generation after its own commit can prove its objects
// unchanged without listing them.
//
// The request goes over a NETLINK_NETFILTER socket opened in the calling thread's network namespace
// and closed again, so it works wherever the backend's own kernel calls run (the agent's namespace,
// or a test's thread inside netns.Do). Legacy iptables is not nf_tables and has no generation.
package nfgen

import (
	"encoding/binary"
	"fmt"
	"log/slog"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Func reads a generation; backends take one as a seam (tests count or fake it).
type Func func() (uint32, error)

// Get returns the current generation id of this network namespace's nf_tables ruleset. It fails
// when the kernel has no nf_tables or the caller lacks CAP_NET_ADMIN.
func Get() (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return 0, fmt.Errorf("nf_tables generation: open netlink socket: %w", err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		// struct nfgenmsg: family AF_UNSPEC, version NFNETLINK_V0, res_id 0.
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("nf_tables generation: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, fmt.Errorf("nf_tables generation: %w", err)
		}
	}
	return 0, fmt.Errorf("nf_tables generation: no NFTA_GEN_ID in the kernel's answer")
}

// Read calls f; ok is false when there is no generation (f nil: legacy iptables, a fake kernel) or
// it cannot be read, which is logged at debug level: the caller then reads its objects instead.
func (f Func) Read(log *slog.Logger) (gen uint32, ok bool) {
	if f == nil {
		return 0, false
	}
	g, err := f()
	if err != nil {
		log.Debug("cannot read the nf_tables generation; reading our objects instead", "err", err)
		return 0, false
	}
	return g, true
}

// Stamp is the generation at which a backend's record was known to match the kernel. The zero
// Stamp knows nothing.
type Stamp struct {
	gen uint32
	ok  bool
}

// At is the stamp of generation g when ok (a successful Read), else the zero Stamp.
func At(g uint32, ok bool) Stamp { return Stamp{gen: g, ok: ok} }

// Is reports whether the stamp is generation g (ok: g was read successfully).
func (s Stamp) Is(g uint32, ok bool) bool { return ok && s.ok && s.gen == g }

// Promoted is s moved from g0 to g1 after only our own commit moved the generation between
// them; any other stamp is returned unchanged.
func (s Stamp) Promoted(g0, g1 uint32) Stamp {
	if s.Is(g0, true) {
		return At(g1, true)
	}
	return s
}
