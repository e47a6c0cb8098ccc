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

// Remove deletes the lock file only when no agent holds it: refused with ErrHeld while held (the
// file stays), removed after Release, and nothing to do the second time.
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Remove(dir); !errors.Is(err, ErrHeld) {
		t.Fatalf("Remove while held: %v, want ErrHeld", err)
	}
	if _, err := os.Stat(l.File()); err != nil {
		t.Fatalf("the held lock's file is gone: %v", err)
	}
	l.Release()
	if got, err := Remove(dir); err != nil || got != l.File() {
		t.Fatalf("Remove: %q, %v; want %s", got, err, l.File())
	}
	if _, err := os.Stat(l.File()); !os.IsNotExist(err) {
		t.Fatalf("the lock file is still there: %v", err)
	}
	if got, err := Remove(dir); err != nil || got != "" {
		t.Fatalf("second Remove: %q, %v; want nothing done", got, err)
	}
}

// An agent that opened the lock file just before a cleanup removed it does not end up holding a
// lock on a file no path names (where a third agent would create a new file and lock it too): it
// takes the lock anew on the file at the path.
func TestAcquireAfterRemoveRace(t *testing.T) {
	dir := t.TempDir()
	first, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	removed := false
	afterOpen = func() {
		if !removed {
			removed = true
			if _, err := Remove(dir); err != nil {
				t.Errorf("Remove between open and lock: %v", err)
			}
		}
	}
	defer func() { afterOpen = nil }()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	afterOpen = nil
	if !removed {
		t.Fatal("the race was not played")
	}
	if _, err := os.Stat(l.File()); err != nil {
		t.Fatalf("the lock is held on a file no path names: %v", err)
	}
	if _, err := Acquire(dir); !errors.Is(err, ErrHeld) {
		t.Fatalf("a third agent: %v, want ErrHeld", err)
	}
}
