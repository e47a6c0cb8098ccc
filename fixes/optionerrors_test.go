package fixes

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A fix's option errors are typed (fix.Invalid, fix.OptionErr), not text naming "fixes.<id>.<key>:"
// that the configuration would have to re-parse: no fix's code words one so.
func TestOptionErrorsAreTyped(t *testing.T) {
	textual := regexp.MustCompile(`Errorf\("fixes\.%s|Errorf\("fixes\."|ParseList\("fixes\.|ParsePrefixes\("fixes\.`)
	for _, root := range []string{".", "../examples/fixes"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if textual.MatchString(line) {
					t.Errorf("%s:%d: an option error as text; return fix.Invalid(key, …) or fix.OptionErr(key, err):\n%s", path, i+1, line)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
