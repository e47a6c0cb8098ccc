// Package logbuffer is a log sink tests read while goroutines write to it (testkit.LogBuffer); a
// leaf package, so that the tests of packages below testkit can use it.
package logbuffer

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a log sink (for slog handlers, klog) that running goroutines (informers, the engine)
// may write to while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines returns the logged lines without their line ends; nil when nothing was logged.
func (l *Buffer) Lines() []string {
	s := strings.TrimSuffix(l.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
