package iptables

import (
	"bytes"
	"context"
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

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args []string, stdin io.Reader, stdout io.Writer) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin, cmd.Stdout = stdin, stdout
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	return errb.Bytes(), err
}
