// Package recvloop reads a socket until it is told to stop: the receive loop of the AF_PACKET
// capture (internal/testing/rawtcp) and of the benchmark's nf_tables commit watcher (bench).
package recvloop

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Run reads fd into buf with recvfrom(2) and hands each result to got (msg is what was read, nil
// with an error), until stop is closed or got returns false. fd must have a receive timeout
// (SO_RCVTIMEO): a read that times out (EAGAIN) or is interrupted (EINTR) is retried after looking
// at stop again, which is how a closed stop is noticed while nothing arrives; got never sees those
// two. Every other error goes to got, which decides whether to go on.
func Run(fd int, buf []byte, stop <-chan struct{}, got func(msg []byte, from unix.Sockaddr, err error) bool) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil && (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) {
			continue
		}
		var msg []byte
		if err == nil {
			msg = buf[:n]
		}
		if !got(msg, from, err) {
			return
		}
	}
}
