// Package nodelock is the node-local lock that lets one agent at a time program a network
// namespace's netfilter rules: a second agent beside the DaemonSet's (run by hand, or a surge pod)
// would otherwise remove the running agent's rules at its start, and two agents of the same backend
// rewrite each other's objects endlessly (#41 rows 5 and 9).
//
// The lock is flock(2) on a file in Dir, named after the network namespace (the inode of
// /proc/self/ns/net), so that it guards exactly what the agent programs: agents in different
// namespaces (the tests' nodes) do not exclude each other, and a host-network Pod and a process on the
// host see the same file (deploy/base mounts Dir from the node). The kernel releases it when the
// holder exits, however it exits. Read-only commands (`plan`, `cleanup --dry-run`, `version`) do not
// take it.
package nodelock

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// Dir is the agent's state directory on the node (fix.StateDir): the lock lives there.
const Dir = fix.StateDir

// Lock is a held lock; Release (or the process's exit) gives it up.
type Lock struct {
	f    *os.File
	path string
}

// ErrHeld is wrapped by Acquire's error when another agent holds the lock.
var ErrHeld = errors.New("another agent programs this node's network namespace")

// Path is the lock file of the calling thread's network namespace under dir.
func Path(dir string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("node lock: network namespace: %w", err)
	}
	return filepath.Join(dir, "agent-netns-"+strconv.FormatUint(st.Ino, 10)+".lock"), nil
}

// Acquire takes the lock of this network namespace in dir (Dir in production) without waiting, and
// records who holds it (the holder line: pid, host name, start time) in the file. When another agent
// holds it the error wraps ErrHeld and names that holder.
func Acquire(dir string) (*Lock, error) {
	path, err := Path(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("node lock: %w", err)
	}
	for range 3 {
		l, again, err := acquireFile(path)
		if !again {
			return l, err
		}
	}
	return nil, fmt.Errorf("node lock %s: removed and created again three times while taking it", path)
}

// afterOpen, when set (tests), runs between opening the lock file and locking it.
var afterOpen func()

// acquireFile takes the lock on path's file; again reports that the file was removed (Remove) or
// replaced after it was opened, so that the lock taken belongs to no path and must be taken anew.
func acquireFile(path string) (l *Lock, again bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("node lock: %w", err)
	}
	if afterOpen != nil {
		afterOpen()
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			h := strings.TrimSpace(string(holder))
			if h == "" {
				h = "unknown holder"
			}
			return nil, false, fmt.Errorf("%w (%s holds %s): this agent programs nothing; stop the other one first, or use `plan` to see what it would program", ErrHeld, h, path)
		}
		return nil, false, fmt.Errorf("node lock %s: %w", path, err)
	}
	held, err1 := f.Stat()
	named, err2 := os.Stat(path)
	if err1 != nil || err2 != nil || !os.SameFile(held, named) {
		f.Close()
		return nil, true, nil
	}
	host, _ := os.Hostname()
	line := fmt.Sprintf("pid %d on host %s since %s\n", os.Getpid(), host, time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(line), 0)
	}
	return &Lock{f: f, path: path}, false, nil
}

// Remove deletes this network namespace's lock file under dir when no agent holds it (the uninstall:
// `cleanup`), returning the path it removed, or "" when there was none. It takes the lock, unlinks
// the file while holding it and gives it up: an agent that opened the file before the unlink and
// locks it after finds that the path no longer names its file, and takes the lock anew (Acquire).
// When an agent holds the lock the error wraps ErrHeld and the file stays.
func Remove(dir string) (string, error) {
	path, err := Path(dir)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	l, err := Acquire(dir)
	if err != nil {
		return "", err
	}
	defer l.Release()
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("node lock: %w", err)
	}
	return path, nil
}

// Release gives the lock up. The file stays (Remove deletes it at uninstall).
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// File is the lock's path.
func (l *Lock) File() string { return l.path }
