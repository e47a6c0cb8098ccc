package toolslot

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAcquire: a second caller waits while the slot is held, gives up with its context naming the
// tool, and gets the slot once it is released.
func TestAcquire(t *testing.T) {
	release, err := Acquire(context.Background(), "first")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Acquire(ctx, "iptables-nft-save"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "iptables-nft-save") {
		t.Fatalf("Acquire while held: %v, want the deadline, naming the tool", err)
	}
	got := make(chan error)
	go func() {
		r, err := Acquire(context.Background(), "second")
		if err == nil {
			r()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Acquire returned (%v) while the slot was held", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
