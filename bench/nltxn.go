package main

import (
	"bytes"
	"net/netip"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// What one nf_tables commit changed, read from the notifications the kernel sends for it (the
// messages `nft monitor` prints) before its NEWGEN: the side-by-side benchmark (kubeproxy.go) learns
// from them which commit carried kube-proxy's rule for a Service and which the agent's, without
// reading the kernel and without guessing who committed (kube-proxy and the agent both run nft, or
// both iptables-nft-restore into the nat table). Only IPv4 addresses the benchmark chose (track) are
// kept: a kube-proxy sync at 10,000 Services rewrites tens of thousands of rules.

// txnKey is one tracked address in a set element's key or in a rule's constants.
type txnKey struct {
	elem  bool   // a set or map element whose key starts with ip; else a rule holding ip as a constant
	table string // nf_tables table ("kube-proxy", "nat", "nnm-ipvs-externalip-dnat", …)
	name  string // the set/map, or the rule's chain
	ip    [4]byte
}

// txn is the net change of one commit: +1 for every element or rule with the key that appeared,
// -1 for every one that went. A chain or map rewritten in place (deleted and added in the same
// commit) nets 0: the kernel held the rule before and after.
type txn map[txnKey]int

// net sums the changes to ip in table's sets (elem) or chains (!elem) whose name starts with prefix.
func (t txn) net(elem bool, table, prefix string, ip [4]byte) int {
	n := 0
	for k, v := range t {
		if k.elem == elem && k.ip == ip && k.table == table && strings.HasPrefix(k.name, prefix) {
			n += v
		}
	}
	return n
}

// tracker is the IPv4 prefixes (of whole bytes: /8, /16, /24) whose addresses a txn keeps.
type tracker struct {
	prefixes []netip.Prefix
	leads    [][]byte // each prefix's leading bytes: a message holding none of them is not parsed
}

func newTracker(prefixes ...netip.Prefix) *tracker {
	t := &tracker{prefixes: prefixes}
	for _, p := range prefixes {
		a := p.Masked().Addr().As4()
		t.leads = append(t.leads, a[:p.Bits()/8])
	}
	return t
}

func (t *tracker) has(ip [4]byte) bool {
	a := netip.AddrFrom4(ip)
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// maybe reports whether b could hold a tracked address (a cheap scan before parsing).
func (t *tracker) maybe(b []byte) bool {
	for _, l := range t.leads {
		if bytes.Contains(b, l) {
			return true
		}
	}
	return false
}

// add records one nf_tables notification (its nfgenmsg header and attributes, msgType the low byte
// of the netlink type) into t, keeping only addresses track accepts. Messages other than rule and
// set element notifications, and malformed ones, change nothing.
func (t txn) add(msgType uint16, data []byte, track *tracker) {
	if len(data) < 4 || !track.maybe(data[4:]) {
		return
	}
	sign := 0
	switch msgType {
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_NEWSETELEM:
		sign = 1
	case unix.NFT_MSG_DELRULE, unix.NFT_MSG_DELSETELEM:
		sign = -1
	default:
		return
	}
	elem := msgType == unix.NFT_MSG_NEWSETELEM || msgType == unix.NFT_MSG_DELSETELEM
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return
	}
	var table, name string
	var ips [][4]byte
	for ad.Next() {
		switch {
		case ad.Type() == 1: // NFTA_RULE_TABLE, NFTA_SET_ELEM_LIST_TABLE
			table = ad.String()
		case ad.Type() == 2: // NFTA_RULE_CHAIN, NFTA_SET_ELEM_LIST_SET
			name = ad.String()
		case elem && ad.Type() == unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			ips = elemKeys(ad.Bytes(), ips)
		case !elem && ad.Type() == unix.NFTA_RULE_EXPRESSIONS:
			ips = ruleConstants(ad.Bytes(), ips)
		}
	}
	if ad.Err() != nil {
		return
	}
	seen := map[[4]byte]bool{}
	for _, ip := range ips {
		if seen[ip] || !track.has(ip) {
			continue
		}
		seen[ip] = true
		t[txnKey{elem: elem, table: table, name: name, ip: ip}] += sign
	}
}

// elemKeys appends the first four bytes of every element key in an NFTA_SET_ELEM_LIST_ELEMENTS list.
func elemKeys(b []byte, out [][4]byte) [][4]byte {
	each(b, unix.NFTA_LIST_ELEM, func(elem []byte) {
		each(elem, unix.NFTA_SET_ELEM_KEY, func(key []byte) {
			each(key, unix.NFTA_DATA_VALUE, func(v []byte) {
				if len(v) >= 4 {
					out = append(out, [4]byte(v[:4]))
				}
			})
		})
	})
	return out
}

// ruleConstants appends the 4-byte values a rule compares with (cmp) or loads (immediate: a dnat
// address): `ip daddr 192.0.2.1`, `-d 192.0.2.1/32`, `dnat to 10.0.0.1`.
func ruleConstants(b []byte, out [][4]byte) [][4]byte {
	each(b, unix.NFTA_LIST_ELEM, func(e []byte) {
		var name string
		var data []byte
		ad, err := netlink.NewAttributeDecoder(e)
		if err != nil {
			return
		}
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_EXPR_NAME:
				name = ad.String()
			case unix.NFTA_EXPR_DATA:
				data = ad.Bytes()
			}
		}
		attr := map[string]uint16{"cmp": unix.NFTA_CMP_DATA, "immediate": unix.NFTA_IMMEDIATE_DATA}[name]
		if attr == 0 || ad.Err() != nil {
			return
		}
		each(data, attr, func(d []byte) {
			each(d, unix.NFTA_DATA_VALUE, func(v []byte) {
				if len(v) == 4 {
					out = append(out, [4]byte(v))
				}
			})
		})
	})
	return out
}

// each calls f with the payload of every attribute of type typ in b (nested flags ignored).
func each(b []byte, typ uint16, f func([]byte)) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return
	}
	for ad.Next() {
		if ad.Type() == typ {
			f(ad.Bytes())
		}
	}
}
