package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/recvloop"
)

// Netfilter netlink constants (linux/netfilter/nfnetlink.h, nf_tables.h).
const (
	nfnlGroupNFTables = 7  // NFNLGRP_NFTABLES
	nfnlSubsysNFTable = 10 // NFNL_SUBSYS_NFTABLES
	nftMsgNewGen      = 15 // NFT_MSG_NEWGEN
	nftaGenProcName   = 3  // NFTA_GEN_PROCNAME
)

// genEvent is one nf_tables commit the kernel announced: every nft / iptables-nft transaction that
// changes something ends with an NFT_MSG_NEWGEN notification, sent when the new ruleset is live.
type genEvent struct {
	at       time.Time
	proc     string // process that committed (e.g. "nft", "iptables-nft-re"); "" after an overflow
	overflow bool   // the socket lost messages (ENOBUFS): a commit may have happened at or before at

	// With a tracking watcher (newTxnWatcher): when the commit's first notification arrived (the
	// kernel sends them all after the commit made the new rules live, then the NEWGEN), and the
	// commit's net change to the tracked addresses.
	first time.Time
	txn   txn
}

// genWatcher listens for nf_tables commits in one network namespace. It is how the benchmark sees
// the moment the kernel holds new rules without polling: the timestamp is taken when the kernel's
// notification arrives, and the caller then checks the kernel state (untimed) to know which commit
// carried the change it waits for.
type genWatcher struct {
	fd     int
	events chan genEvent
	stop   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	overflows int

	track *tracker    // nil: NEWGEN only; else the addresses whose changes each event carries
	raw   chan rawMsg // track only: reads waiting to be parsed
	cur   txn         // the commit being announced (track only)
	first time.Time   // when its first notification arrived
}

func newGenWatcher(netnsPath string) (*genWatcher, error) { return newTxnWatcher(netnsPath, nil) }

// newTxnWatcher is a genWatcher whose events also say what each commit changed for the addresses
// track accepts (nltxn.go).
func newTxnWatcher(netnsPath string, track *tracker) (*genWatcher, error) {
	w := &genWatcher{events: make(chan genEvent, 4096), stop: make(chan struct{}), track: track}
	if track != nil {
		w.raw = make(chan rawMsg, 1<<16)
	}
	err := netns.Do(netnsPath, func() error {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		// Rule rewrites of 20,000 iptables rules notify every deleted and added rule: a large buffer
		// keeps the NEWGEN at the end of the batch from being dropped.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20)
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (nfnlGroupNFTables - 1)}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind netlink group NFNLGRP_NFTABLES: %w", err)
		}
		w.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.wg.Add(1)
	go w.loop()
	if w.raw != nil {
		w.wg.Add(1)
		go w.parse()
	}
	return w, nil
}

func (w *genWatcher) loop() {
	defer w.wg.Done()
	recvloop.Run(w.fd, make([]byte, 4<<20), w.stop, func(msg []byte, _ unix.Sockaddr, err error) bool {
		now := time.Now()
		overflow := errors.Is(err, unix.ENOBUFS)
		if err != nil && !overflow {
			return false
		}
		if w.raw == nil {
			w.handle(now, msg, overflow)
			return true
		}
		// A tracking watcher parses on another goroutine: a sync of kube-proxy's iptables mode at
		// 10,000 Services sends tens of thousands of notifications, and a message is timed when it
		// is read, not after the ones queued before it have been parsed.
		w.raw <- rawMsg{at: now, b: bytes.Clone(msg), overflow: overflow}
		return true
	})
	if w.raw != nil {
		close(w.raw)
	}
}

// rawMsg is one read of the socket, as the reader timed it.
type rawMsg struct {
	at       time.Time
	b        []byte
	overflow bool
}

func (w *genWatcher) parse() {
	defer w.wg.Done()
	for m := range w.raw {
		w.handle(m.at, m.b, m.overflow)
	}
}

// handle turns one read (read at now) into events.
func (w *genWatcher) handle(now time.Time, msg []byte, overflow bool) {
	if overflow {
		w.mu.Lock()
		w.overflows++
		w.mu.Unlock()
		w.cur, w.first = nil, time.Time{} // part of the commit was lost
		w.send(genEvent{at: now, first: now, overflow: true})
		return
	}
	msgs, err := syscall.ParseNetlinkMessage(msg)
	if err != nil {
		return
	}
	for _, m := range msgs {
		if m.Header.Type>>8 != nfnlSubsysNFTable {
			continue
		}
		if w.track != nil && w.first.IsZero() {
			w.first = now
		}
		if m.Header.Type != nfnlSubsysNFTable<<8|nftMsgNewGen {
			if w.track != nil {
				if w.cur == nil {
					w.cur = txn{}
				}
				w.cur.add(m.Header.Type&0xff, m.Data, w.track)
			}
			continue
		}
		e := genEvent{at: now, first: now, proc: procName(m.Data)}
		if w.track != nil {
			e.first, e.txn = w.first, w.cur
			w.cur, w.first = nil, time.Time{}
		}
		w.send(e)
	}
}

func (w *genWatcher) send(e genEvent) {
	select {
	case w.events <- e:
	default: // nobody is waiting; the benchmark drains before each measurement
	}
}

// procName reads NFTA_GEN_PROCNAME from a NEWGEN message body (nfgenmsg, 4 bytes, then attributes).
func procName(data []byte) string {
	if len(data) < 4 {
		return ""
	}
	for b := data[4:]; len(b) >= 4; {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) & 0x3fff
		if l < 4 || l > len(b) {
			return ""
		}
		if typ == nftaGenProcName {
			v := b[4:l]
			for len(v) > 0 && v[len(v)-1] == 0 {
				v = v[:len(v)-1]
			}
			return string(v)
		}
		b = b[(l+3)&^3:]
	}
	return ""
}

// drain discards queued events.
func (w *genWatcher) drain() {
	for {
		select {
		case <-w.events:
		default:
			return
		}
	}
}

func (w *genWatcher) Overflows() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overflows
}

func (w *genWatcher) Close() {
	close(w.stop)
	w.wg.Wait()
	unix.Close(w.fd)
}
