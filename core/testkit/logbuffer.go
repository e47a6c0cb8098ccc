package testkit

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer is a log sink (for slog handlers, klog) that running goroutines (informers, the engine)
// may write to while the test reads it.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines is what was written so far, a line each (without the last line's newline).
func (l *LogBuffer) Lines() []string { return strings.Split(strings.TrimSpace(l.String()), "\n") }
