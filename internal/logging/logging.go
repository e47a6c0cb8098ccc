// Package logging builds the agent's one log stream: log/slog as text or JSON, at a level a config
// reload can change, with client-go's klog lines routed through the same handler so that a stream
// never mixes klog's "E1201 14:21:24.748657 …" lines with slog's.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"k8s.io/klog/v2"
)

// The values of the logFormat key.
const (
	// FormatText is slog's key=value lines (the default).
	FormatText = "text"
	// FormatJSON is one JSON object per line, as kube-proxy's and Cilium's JSON options.
	FormatJSON = "json"
)

// Formats are the accepted log formats, for validation and help texts.
var Formats = []string{FormatText, FormatJSON}

// Levels are the accepted log levels (slog's names, lower case).
var Levels = []string{"debug", "info", "warn", "error"}

// ParseLevel turns a logLevel value into a slog level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q is not one of %s", s, strings.Join(Levels, ", "))
	}
	return l, nil
}

// New returns a logger writing format to w at the level held by level (change it with Set; the
// logger and everything routed into it follow).
func New(w io.Writer, format string, level *slog.LevelVar) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case FormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("log format %q is not one of %s", format, strings.Join(Formats, ", "))
	}
}

// RouteKlog sends klog's output — client-go's informers, event broadcaster, leader election — to
// log's handler, in its format and at its level (klog's V(n) becomes slog level -n, so V(4) lines
// appear at debug). klog's logger is process-wide: only the agent's `run` calls this.
func RouteKlog(log *slog.Logger) {
	klog.SetSlogLogger(log)
}
