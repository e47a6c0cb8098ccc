package iptables

import (
	"fmt"
	"strings"
	"testing"
)

// ExecRunner returns a tool's stderr whole when it is short, and its first MaxStderr bytes with
// the count of the rest when the tool writes more (iptables-save's per-rule connlabel warning).
func TestExecRunnerCapsStderr(t *testing.T) {
	for _, n := range []int{10, MaxStderr, 10 * MaxStderr} {
		script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' w >&2; exit 3", n)
		stderr, err := ExecRunner{}.Run(t.Context(), "sh", []string{"-c", script}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("%d bytes: err = %v, want exit status 3", n, err)
		}
		kept := min(n, MaxStderr)
		want := strings.Repeat("w", kept)
		if n > MaxStderr {
			want += fmt.Sprintf("… (%d more bytes)", n-MaxStderr)
		}
		if string(stderr) != want {
			t.Errorf("%d bytes written: got %d bytes back (%.40q…), want %d", n, len(stderr), stderr, len(want))
		}
	}
}
