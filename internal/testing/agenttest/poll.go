package agenttest

import (
	"context"
	"errors"
	"fmt"
	"time"
)

type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent wraps an error that makes Poll give up at once (e.g. the process under test exited).
func Permanent(err error) error { return permanentError{err} }

// Poll calls cond every interval until it returns nil, returns a Permanent error, ctx ends or timeout
// passes. The error names the timeout and carries cond's last error.
func Poll(ctx context.Context, timeout, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return perm.err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met within %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// Holds checks that cond stays true (returns nil) for the whole duration, polling every interval; it
// returns cond's first error.
func Holds(ctx context.Context, duration, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(duration)
	for {
		if err := cond(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
