package fix

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

type baseFix struct{ Base[testConfig, int] }

func baseSpec() Spec[testConfig, int] {
	return Spec[testConfig, int]{
		ID: "base-test", Description: "a fix for the test",
		Default: func() testConfig { return testConfig{Hooks: []string{"input"}, Limit: 2} },
		Parse: func(c testConfig) (int, error) {
			if c.Limit <= 0 {
				return 0, errors.New("fixes.base-test.limit: must be positive")
			}
			return c.Limit * len(c.Hooks), nil
		},
		Reads: []TableRef{testTable},
	}
}

func TestBase(t *testing.T) {
	var f baseFix
	if err := f.Configure(nil); err == nil || !strings.Contains(err.Error(), "Init") {
		t.Fatalf("Configure before Init: %v, want an error saying Init is missing", err)
	}
	reg, logs := prometheus.NewRegistry(), &bytes.Buffer{}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "nnm_base_test_g", Help: "g."})
	if err := f.Init(baseSpec(), Params{Registry: reg, Logger: slog.New(slog.NewTextHandler(logs, nil))}, g); err != nil {
		t.Fatal(err)
	}
	if f.ID() != "base-test" || f.Description() != "a fix for the test" || len(f.Reads()) != 1 || f.Reads()[0].Name() != "Test" || f.DefaultEnabled(Env{}) {
		t.Errorf("Base does not report its Spec: %q %q %+v %v", f.ID(), f.Description(), f.Reads(), f.DefaultEnabled(Env{}))
	}
	if f.Config() != 2 {
		t.Errorf("Config() = %d, want the parsed defaults 2", f.Config())
	}
	if err := f.Configure(map[string]any{"hooks": "input,forward", "limit": 3}); err != nil || f.Config() != 6 {
		t.Errorf("Configure: %v, Config() = %d, want 6", err, f.Config())
	}
	if mfs, _ := reg.Gather(); len(mfs) != 1 {
		t.Errorf("the collector was not registered: %d metric families", len(mfs))
	}
	f.Log.Info("hello")
	if !strings.Contains(logs.String(), "fix=base-test") {
		t.Errorf("Log lacks the fix field: %s", logs)
	}
	// A second registration of the same metric is an error naming the fix.
	var again baseFix
	if err := again.Init(baseSpec(), Params{Registry: reg}, g); err == nil || !strings.Contains(err.Error(), "base-test") {
		t.Errorf("duplicate metric: %v, want an error naming the fix", err)
	}
}

func TestBaseSpecErrors(t *testing.T) {
	var f baseFix
	for _, tc := range []struct {
		change func(*Spec[testConfig, int])
		want   string
	}{
		{func(s *Spec[testConfig, int]) { s.ID = "Base_Test" }, `"Base_Test" is not kebab-case`},
		{func(s *Spec[testConfig, int]) { s.Description = "" }, "Description"},
		{func(s *Spec[testConfig, int]) { s.Parse = nil }, "no Parse"},
		// No Default is the zero testConfig, whose Limit 0 Parse refuses.
		{func(s *Spec[testConfig, int]) { s.Default = nil }, "default configuration"},
	} {
		s := baseSpec()
		tc.change(&s)
		if err := f.Init(s, Params{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Init: %v, want an error containing %q", err, tc.want)
		}
	}
	// Without Parse the configuration is taken as it is, when the types agree.
	var plain struct{ Base[testConfig, testConfig] }
	spec := Spec[testConfig, testConfig]{ID: "plain", Description: "d", Default: func() testConfig { return testConfig{Limit: 4} }}
	if err := plain.Init(spec, Params{}); err != nil || plain.Config().Limit != 4 {
		t.Errorf("Init without Parse: %v, %+v", err, plain.Config())
	}
	// Without Default the configuration starts from the zero value.
	if err := plain.Init(Spec[testConfig, testConfig]{ID: "plain", Description: "d"}, Params{}); err != nil || plain.Config().Limit != 0 || plain.Config().Hooks != nil {
		t.Errorf("Init without Default: %v, %+v, want the zero configuration", err, plain.Config())
	}
}

var testTable = NewTable[[]string]("Test")

func TestTableGetSet(t *testing.T) {
	s := NewSnapshot(Env{}, nil)
	if got := testTable.Get(s); got != nil {
		t.Errorf("Get of a table the snapshot lacks = %v, want nil", got)
	}
	testTable.Set(s, []string{"a"})
	if got := testTable.Get(s); len(got) != 1 || got[0] != "a" {
		t.Errorf("Get after Set = %v", got)
	}
	// A table of another type under the same name reads as absent, not as a panic.
	if got := NewTable[int]("Test").Get(s); got != 0 {
		t.Errorf("Get of a table of another type = %v, want 0", got)
	}
}
