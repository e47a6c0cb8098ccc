package iptables

import (
	"bytes"
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

// Run implements Runner. Of stderr it keeps the first MaxStderr bytes (cappedBuffer).
func (ExecRunner) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin, cmd.Stdout = stdin, stdout
	var errb cappedBuffer
	cmd.Stderr = &errb
	err := cmd.Run()
	return errb.Bytes(), err
}

// MaxStderr is how much of a tool's stderr the agent keeps, for the error that quotes it. A tool can
// write far more than its error: iptables-save warns once per connlabel rule when
// /etc/xtables/connlabel.conf is missing (76 bytes a rule, 760 KB at 10,000 entries).
const MaxStderr = 16 << 10

// cappedBuffer is an io.Writer that keeps the first MaxStderr bytes written to it and counts the rest.
type cappedBuffer struct {
	buf     bytes.Buffer
	dropped int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	keep := min(len(p), MaxStderr-c.buf.Len())
	c.buf.Write(p[:keep])
	c.dropped += len(p) - keep
	return len(p), nil
}

// Bytes is what was kept, followed by how many bytes were not.
func (c *cappedBuffer) Bytes() []byte {
	if c.dropped == 0 {
		return c.buf.Bytes()
	}
	return fmt.Appendf(c.buf.Bytes(), "… (%d more bytes)", c.dropped)
}
