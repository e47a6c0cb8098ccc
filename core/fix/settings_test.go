package fix

import (
	"errors"
	"strings"
	"testing"
)

type testConfig struct {
	Hooks []string `mapstructure:"hooks"`
	Limit int      `mapstructure:"limit"`
}

func TestSettings(t *testing.T) {
	defaults := func() testConfig { return testConfig{Hooks: []string{"input"}, Limit: 1} }
	parse := func(c testConfig) (int, error) {
		if c.Limit <= 0 {
			return 0, errors.New("fixes.t.limit: must be positive")
		}
		return c.Limit * len(c.Hooks), nil
	}
	s, err := NewSettings("t", defaults, parse)
	if err != nil {
		t.Fatal(err)
	}
	if s.Get() != 1 {
		t.Fatalf("defaults not parsed: %d", s.Get())
	}
	if err := s.Configure(map[string]any{"hooks": "input,forward", "limit": "3"}); err != nil {
		t.Fatal(err)
	}
	if s.Get() != 6 {
		t.Fatalf("options not taken: %d", s.Get())
	}
	// Omitted keys fall back to the defaults, not to the previous options.
	if err := s.Configure(map[string]any{}); err != nil || s.Get() != 1 {
		t.Fatalf("empty options must mean defaults: %d, %v", s.Get(), err)
	}
	for _, bad := range []map[string]any{{"limit": 0}, {"limitz": 2}, {"limit": "many"}} {
		if err := s.Configure(bad); err == nil || !strings.Contains(err.Error(), "limit") {
			t.Fatalf("options %v: want an error naming the key, got %v", bad, err)
		}
		if s.Get() != 1 {
			t.Fatalf("rejected options %v changed the settings to %d", bad, s.Get())
		}
	}
	if _, err := NewSettings("t", func() testConfig { return testConfig{} }, parse); err == nil {
		t.Fatal("defaults that do not parse must be an error")
	}
}
