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

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

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
