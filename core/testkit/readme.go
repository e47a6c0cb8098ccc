package testkit

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// ReadmeSections are the sections every fix README has, in this order.
var ReadmeSections = []string{"## What it does", "## Configuration", "## Rules", "## Metrics", "## Example"}

// Readme is a fix's README.md, checked by ReadREADME.
type Readme struct {
	// Text is the whole file.
	Text string
	// Options are the keys under fixes.<id> of the README's first yaml example, "enabled" removed:
	// what to hand to the fix's Configure to prove the example is valid configuration.
	Options map[string]any
	// Enabled is the example's fixes.<id>.enabled, nil when it does not say.
	Enabled *bool
}

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// ReadREADME reads the README at path and fails the test unless it has ReadmeSections in order and a
// yaml example that is strict agent configuration with a fixes.<id> section.
func ReadREADME(t testing.TB, path, id string) *Readme {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("README: %v", err)
		return nil
	}
	r := &Readme{Text: string(b)}
	if !strings.HasPrefix(r.Text, "# "+id+"\n") {
		t.Errorf("%s: the first line must be the title \"# %s\"", path, id)
	}
	at := 0
	for _, s := range ReadmeSections {
		i := strings.Index(r.Text, "\n"+s+"\n")
		if i < 0 {
			t.Errorf("%s lacks section %q", path, s)
			continue
		}
		if i < at {
			t.Errorf("%s: section %q is out of order (want %s)", path, s, strings.Join(ReadmeSections, ", "))
		}
		at = i
	}
	m := yamlBlock.FindStringSubmatch(r.Text)
	if m == nil {
		t.Fatalf("%s has no ```yaml example", path)
		return nil
	}
	var doc struct {
		Fixes map[string]map[string]any `json:"fixes"`
	}
	if err := yaml.UnmarshalStrict([]byte(m[1]), &doc); err != nil {
		t.Fatalf("%s: the yaml example is not agent configuration: %v", path, err)
		return nil
	}
	opts, ok := doc.Fixes[id]
	if !ok {
		t.Fatalf("%s: the yaml example does not configure fixes.%s", path, id)
		return nil
	}
	if opts == nil {
		opts = map[string]any{}
	}
	if v, ok := opts["enabled"]; ok {
		b, isBool := v.(bool)
		if !isBool {
			t.Fatalf("%s: fixes.%s.enabled is %v, not a boolean", path, id, v)
			return nil
		}
		r.Enabled = &b
		delete(opts, "enabled")
	}
	r.Options = opts
	return r
}

// Contains fails the test unless the README holds s verbatim (e.g. a rule dump from Format, or a
// metric name); what says what s is.
func (r *Readme) Contains(t testing.TB, what, s string) {
	t.Helper()
	if !strings.Contains(r.Text, s) {
		t.Errorf("README is stale: it lacks %s:\n%s", what, s)
	}
}

// DocumentsMetrics fails the test unless every name appears in the README in backquotes.
func (r *Readme) DocumentsMetrics(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if !strings.Contains(r.Text, "`"+n+"`") {
			t.Errorf("README does not document metric `%s`", n)
		}
	}
}
