package netns

import (
	"strings"
	"testing"
)

func TestLogWarningsKeepsTheLastWarningsAndErrors(t *testing.T) {
	log := strings.Join([]string{
		`time=1 level=WARN msg="first warning"`,
		`time=2 level=DEBUG msg=chatter`,
		`time=2 level=WARN msg="probe failing" path=/readyz`,
		`time=3 level=ERROR msg="an error"`,
		`time=4 level=INFO msg="level=WARN in a message is no warning"`,
		`time=5 level=WARN msg="last warning"`,
		`time=6 level=DEBUG msg=chatter`,
	}, "\n")
	if got, want := LogWarnings(log, 2), "time=3 level=ERROR msg=\"an error\"\ntime=5 level=WARN msg=\"last warning\""; got != want {
		t.Errorf("LogWarnings(log, 2) = %q, want %q", got, want)
	}
	if got := LogWarnings(log, 10); !strings.HasPrefix(got, "time=1 level=WARN") {
		t.Errorf("LogWarnings(log, 10) does not start with the first warning: %q", got)
	}
}
