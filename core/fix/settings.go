package fix

import (
	"errors"
	"fmt"
	"sync"
)

// Settings holds a fix's validated options and swaps them atomically. Configure decodes the options
// over the defaults (strictly, with Decode), validates them with parse, and only then replaces what
// Get returns, so a rejected configuration leaves the running one in place. C is the config struct
// the options decode into; S is what the fix works with (C itself when parse only validates).
//
//	f.opts, err = fix.NewSettings(ID, DefaultConfig, parse)
//	func (f *Fix) Configure(o map[string]any) error { return f.opts.Configure(o) }
//	cfg := f.opts.Get() // in Rules
type Settings[C, S any] struct {
	id       string
	defaults func() C
	parse    func(C) (S, error)

	mu  sync.RWMutex
	cur S
}

// NewSettings returns Settings holding the parsed defaults; defaults that do not parse are an error.
func NewSettings[C, S any](id string, defaults func() C, parse func(C) (S, error)) (*Settings[C, S], error) {
	s := &Settings[C, S]{id: id, defaults: defaults, parse: parse}
	cur, err := parse(defaults())
	if err != nil {
		return nil, fmt.Errorf("fixes.%s: default configuration: %w", id, err)
	}
	s.cur = cur
	return s, nil
}

// Configure decodes, validates and takes options (the keys under fixes.<id>, "enabled" removed).
func (s *Settings[C, S]) Configure(options map[string]any) error {
	cfg := s.defaults()
	if err := Decode(options, &cfg); err != nil {
		return fmt.Errorf("fixes.%s: %w", s.id, err)
	}
	cur, err := s.parse(cfg)
	if err != nil {
		// Parse names options by their key (Invalid); the fix is this one.
		for _, e := range ErrorLeaves(err) {
			var oe *OptionError
			if errors.As(e, &oe) && oe.Fix == "" {
				oe.Fix = s.id
			}
		}
		return err
	}
	s.mu.Lock()
	s.cur = cur
	s.mu.Unlock()
	return nil
}

// Get returns the current settings.
func (s *Settings[C, S]) Get() S {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}
