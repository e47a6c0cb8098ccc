package testkit

import "github.com/network-node-manager/network-node-manager/internal/logbuffer"

// LogBuffer is a log sink (for slog handlers, klog) that running goroutines (informers, the engine)
// may write to while the test reads it.
type LogBuffer = logbuffer.Buffer
