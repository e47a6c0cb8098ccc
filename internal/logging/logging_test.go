package logging

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"

	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// newLog is a logger of format writing to a buffer, at the level of the returned LevelVar (info).
func newLog(t *testing.T, format string) (*slog.Logger, *testkit.LogBuffer, *slog.LevelVar) {
	t.Helper()
	buf, level := &testkit.LogBuffer{}, new(slog.LevelVar)
	log, err := New(buf, format, level)
	if err != nil {
		t.Fatal(err)
	}
	return log, buf, level
}

// TestJSONStreamCarriesKlog routes klog into a JSON logger and writes through the paths client-go
// uses (klog.ErrorS and Errorf, utilruntime.HandleError as informers do, a contextual logger's V(4) as
// the reflector does): every line of the stream must be one JSON object, the klog lines included, and
// the level must follow the LevelVar.
func TestJSONStreamCarriesKlog(t *testing.T) {
	log, buf, level := newLog(t, FormatJSON)
	RouteKlog(log)
	t.Cleanup(func() { klog.ClearLogger() })

	log.Info("from slog", "fix", "invalid-drop")
	klog.ErrorS(errors.New("connection refused"), "Server rejected event (will not retry!)", "event", "x")
	klog.Errorf("event_broadcaster: %s", "unable to write event")
	utilruntime.HandleError(errors.New("watch of *v1.Service ended"))
	klog.FromContext(context.Background()).V(4).Info("Caches populated (hidden at info)")
	level.Set(slog.LevelDebug)
	klog.FromContext(context.Background()).V(4).Info("Caches populated (shown at debug)")
	klog.Flush()

	var msgs []string
	lines := buf.Lines()
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON line: %q (%v)\nstream:\n%s", line, err, strings.Join(buf.Lines(), "\n"))
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Errorf("line without %q: %s", k, line)
			}
		}
		msgs = append(msgs, rec["msg"].(string))
	}
	// utilruntime.HandleError logs "Unhandled Error" with the error as a field: look at whole lines.
	all := strings.Join(lines, "\n")
	for _, want := range []string{"from slog", "Server rejected event", "unable to write event", "watch of *v1.Service ended", "shown at debug"} {
		if !strings.Contains(all, want) {
			t.Errorf("stream lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(strings.Join(msgs, "\n"), "hidden at info") {
		t.Errorf("a klog V(4) line passed the info level:\n%s", all)
	}
}

func TestTextFormatAndErrors(t *testing.T) {
	log, buf, level := newLog(t, FormatText)
	log.Info("hello", "k", "v")
	if got := buf.Lines()[0]; !strings.Contains(got, "level=INFO msg=hello k=v") {
		t.Errorf("text line = %q", got)
	}
	if _, err := New(buf, "logfmt", level); err == nil || !strings.Contains(err.Error(), `"logfmt" is not one of text, json`) {
		t.Errorf("unknown format: err = %v", err)
	}
	if _, err := ParseLevel("verbose"); err == nil || !strings.Contains(err.Error(), `"verbose"`) {
		t.Errorf("unknown level: err = %v", err)
	}
	for _, l := range Levels {
		if _, err := ParseLevel(l); err != nil {
			t.Errorf("ParseLevel(%q): %v", l, err)
		}
	}
}
