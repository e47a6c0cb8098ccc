package nodelock

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// A second Acquire while the lock is held fails with ErrHeld and names the holder; after Release the
// lock can be taken again. (flock locks belong to the open file, so one process can play both.)
func TestAcquireRefusesASecondHolder(t *testing.T) {
	dir := t.TempDir()
	first, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(dir)
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d on host", os.Getpid())) {
		t.Fatalf("second Acquire: %v, want ErrHeld naming pid %d", err, os.Getpid())
	}
	t.Logf("second Acquire: %v", err)
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	again.Release()
}
