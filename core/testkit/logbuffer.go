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

// Lines returns the logged lines without their line ends; nil when nothing was logged.
func (l *LogBuffer) Lines() []string {
	s := strings.TrimSuffix(l.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
