package iptables

import (
	"context"
	"fmt"
	"io"
	"os/exec"
)

// Runner executes one command. It is the seam through which tests observe the exact
// iptables-restore input and run commands inside a network namespace. stdin (nil: none) is read as
// the command runs and stdout (nil: discarded) receives its output as it is written, so a dump of
// 20,000 rules is parsed as it arrives and a restore input is rendered as it is sent, neither held
// whole; what the command wrote to stderr is returned.
type Runner interface {
	Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) (stderr []byte, err error)
}

// ExecRunner runs commands with os/exec in the caller's network namespace.
type ExecRunner struct{}

// Run implements Runner. Of stderr it keeps MaxStderr bytes (cappedBuffer).
func (ExecRunner) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin, cmd.Stdout = stdin, stdout
	var errb cappedBuffer
	cmd.Stderr = &errb
	err := cmd.Run()
	return errb.Bytes(), err
}

// MaxStderr is how much of a tool's stderr the agent keeps, for the error that quotes it: its first
// and its last MaxStderr/2 bytes, so that a failing tool's last words are kept too. A tool can write
// far more than its error: iptables-save warns once per connlabel rule when
// /etc/xtables/connlabel.conf is missing (76 bytes a rule, 760 KB at 10,000 entries).
const MaxStderr = 16 << 10

// cappedBuffer is an io.Writer that keeps the first and the last MaxStderr/2 bytes written to it
// and counts the bytes in between.
type cappedBuffer struct {
	head, tail []byte
	dropped    int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	const half = MaxStderr / 2
	n := len(p)
	k := min(len(p), half-len(c.head))
	c.head, p = append(c.head, p[:k]...), p[k:]
	c.tail = append(c.tail, p...)
	if over := len(c.tail) - half; over > half { // trimmed once it is twice what is kept
		c.dropped += over
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
	return n, nil
}

// Bytes is what was kept: the head, how many bytes were left out if any, and the tail.
func (c *cappedBuffer) Bytes() []byte {
	tail, dropped := c.tail, c.dropped
	if over := len(tail) - MaxStderr/2; over > 0 {
		tail, dropped = tail[over:], dropped+over
	}
	out := append([]byte(nil), c.head...)
	if dropped > 0 {
		out = fmt.Appendf(out, "… (%d bytes left out) …", dropped)
	}
	return append(out, tail...)
}
