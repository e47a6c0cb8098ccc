package agenttest

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(`# HELP nnm_rules_programmed Rules.
# TYPE nnm_rules_programmed gauge
nnm_rules_programmed{backend="iptables",family="ipv4",fix="invalid-drop"} 1
nnm_rules_programmed{backend="iptables",family="ipv6",fix="invalid-drop"} 2
nnm_fix_objects_skipped{family="ipv4",fix="x",reason="a \"quoted\", comma"} 3
nnm_up 1.5e+09
`)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Value("nnm_rules_programmed", "fix", "invalid-drop", "family", "ipv6"); !ok || v != 2 {
		t.Errorf("Value = %v, %v; want 2, true", v, ok)
	}
	if v := m.Sum("nnm_rules_programmed", "fix", "invalid-drop"); v != 3 {
		t.Errorf("Sum = %v, want 3", v)
	}
	if _, ok := m.Value("nnm_rules_programmed", "fix", "nope"); ok {
		t.Error("Value found a sample that does not exist")
	}
	if v, _ := m.Value("nnm_fix_objects_skipped", "reason", `a "quoted", comma`); v != 3 {
		t.Errorf("escaped label value: got %v, want 3", v)
	}
	if v, _ := m.Value("nnm_up"); v != 1.5e9 {
		t.Errorf("nnm_up = %v", v)
	}
	if got, want := m.Find("nnm_fix_objects_skipped")[0].String(), `nnm_fix_objects_skipped{family="ipv4",fix="x",reason="a \"quoted\", comma"} 3`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	h, err := ParseMetrics(`# TYPE nnm_sync_duration_seconds histogram
nnm_sync_duration_seconds_bucket{fix="a",le="0.1"} 2
nnm_sync_duration_seconds_bucket{fix="a",le="+Inf"} 3
nnm_sync_duration_seconds_sum{fix="a"} 0.5
nnm_sync_duration_seconds_count{fix="a"} 3
`)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := h.Value("nnm_sync_duration_seconds_bucket", "fix", "a", "le", "0.1"); !ok || v != 2 {
		t.Errorf("histogram bucket = %v, %v; want 2", v, ok)
	}
	if v, _ := h.Value("nnm_sync_duration_seconds_count", "fix", "a"); v != 3 {
		t.Errorf("histogram count = %v, want 3", v)
	}
	if _, err := ParseMetrics("nnm_bad{x=\"1\" 1\n"); err == nil {
		t.Error("unterminated label set parsed without error")
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Second, time.Millisecond, func() error {
		n++
		if n < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || n != 3 {
		t.Errorf("Poll = %v after %d calls", err, n)
	}
	err := Poll(context.Background(), 20*time.Millisecond, time.Millisecond, func() error { return errors.New("never") })
	if err == nil {
		t.Error("Poll succeeded on a condition that never holds")
	}
	perm := errors.New("gone")
	start := time.Now()
	if err := Poll(context.Background(), time.Minute, time.Millisecond, func() error { return Permanent(perm) }); !errors.Is(err, perm) || time.Since(start) > time.Second {
		t.Errorf("Permanent: got %v after %v", err, time.Since(start))
	}
	if err := Holds(context.Background(), 10*time.Millisecond, time.Millisecond, func() error { return nil }); err != nil {
		t.Error(err)
	}
}
