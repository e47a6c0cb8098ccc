// Package configtest makes configuration files for tests and benchmarks of the config loader.
package configtest

import (
	"fmt"
	"strings"

	"github.com/network-node-manager/network-node-manager/internal/config"
)

// LargestEntries is how many nodeOverrides entries of Largest's shape fit in config.MaxFileSize: the
// count of the largest file the agent accepts (issue #63 measured its load with this many).
const LargestEntries = 6393

// Largest returns a config file of nodeOverrides entries as an operator writes them (a selector on
// two labels; two fixes' settings, one with a list), as many as fit under config.MaxFileSize: the
// largest file the agent accepts, and the most keys per byte such a file holds. Each entry names a
// pool of its own, so no two selectors are alike.
func Largest() []byte { return File(config.MaxFileSize) }

// File is Largest's kind of file with as many entries as fit in size bytes.
func File(size int) []byte {
	var b strings.Builder
	b.WriteString("configVersion: 1\nfixes:\n  invalid-drop: {enabled: true, hooks: [input]}\nnodeOverrides:\n")
	for i := 0; ; i++ {
		entry := fmt.Sprintf("- nodeSelector:\n    matchLabels: {pool: pool-%04d, zone: zn-%02d}\n  fixes:\n"+
			"    invalid-drop: {enabled: true, hooks: [input, forward]}\n    mss-clamp: {enabled: false}\n", i, i%16)
		if b.Len()+len(entry) > size {
			return []byte(b.String())
		}
		b.WriteString(entry)
	}
}
