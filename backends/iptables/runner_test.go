package iptables

import (
	"fmt"
	"strings"
	"testing"
)

// ExecRunner returns a tool's stderr whole when it is short, and when the tool writes more
// (iptables-save's per-rule connlabel warning) its first and last MaxStderr/2 bytes, with the count
// of those between: a failing tool's last line, its error, is kept.
func TestExecRunnerCapsStderr(t *testing.T) {
	const half = MaxStderr / 2
	for _, n := range []int{10, MaxStderr - 4, MaxStderr, 3*MaxStderr + 7} {
		// n-4 bytes of 'w' in writes of 1 KiB at most, then "END\n".
		script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' w | dd bs=1024 status=none >&2; echo END >&2; exit 3", n-4)
		stderr, err := ExecRunner{}.Run(t.Context(), "sh", []string{"-c", script}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("%d bytes: err = %v, want exit status 3", n, err)
		}
		whole := strings.Repeat("w", n-4) + "END\n"
		want := whole
		if n > MaxStderr {
			want = whole[:half] + fmt.Sprintf("… (%d bytes left out) …", n-MaxStderr) + whole[n-half:]
		}
		if string(stderr) != want {
			t.Errorf("%d bytes written: got %d bytes back (…%q), want %d (…%q)", n, len(stderr), tailOf(string(stderr)), len(want), tailOf(want))
		}
	}
}

func tailOf(s string) string { return s[max(0, len(s)-40):] }
