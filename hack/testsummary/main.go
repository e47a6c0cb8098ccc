// Command testsummary reads `go test -json` on stdin and prints what a developer needs from a long
// run: the package result lines (ok / FAIL / no test files), the output of every failed test, the
// reason of every skipped one, then a recap of each failed test's own messages (its t.Error and
// t.Fatal lines, so that the cause stays in the last lines of a long log), then a table of how many tests (subtests included) ran, passed, failed
// and were skipped in each package and how many seconds the package ran, and a closing line
// "N passed, N failed, N skipped". It exits 1
// when a test or a build failed.
//
//	set -o pipefail; go test -json ./... | go run ./hack/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string  // build-output, build-fail
	Elapsed    float64 // seconds, on a test's or package's pass, fail or skip
}

type counts struct {
	run, pass, fail, skip int
	seconds               float64 // the package's run (its pass, fail or skip event)
}

type summary struct {
	out     io.Writer
	pkgs    map[string]*counts
	pending map[string][]string // output of a running test, by package + test
	failed  bool                // a package or build failed (also without a failed test)
	recap   []string            // per failed test: its name and its messages (recapLines)
}

func newSummary(out io.Writer) *summary {
	return &summary{out: out, pkgs: map[string]*counts{}, pending: map[string][]string{}}
}

func (s *summary) pkg(name string) *counts {
	c := s.pkgs[name]
	if c == nil {
		c = &counts{}
		s.pkgs[name] = c
	}
	return c
}

// line handles one input line.
func (s *summary) line(raw string) {
	var e event
	if !strings.HasPrefix(raw, "{") || json.Unmarshal([]byte(raw), &e) != nil {
		fmt.Fprintln(s.out, raw) // not an event (a tool's own message): pass it through
		return
	}
	key := e.Package + "\x00" + e.Test
	switch {
	case e.Action == "build-output":
		fmt.Fprint(s.out, e.Output)
	case e.Action == "build-fail":
		s.failed = true
	case e.Test == "":
		s.packageEvent(e)
	case e.Action == "run":
		s.pkg(e.Package).run++
	case e.Action == "output":
		s.pending[key] = append(s.pending[key], e.Output)
	case e.Action == "pass":
		s.pkg(e.Package).pass++
		delete(s.pending, key)
	case e.Action == "fail":
		s.pkg(e.Package).fail++
		fmt.Fprint(s.out, strings.Join(s.pending[key], ""))
		if msgs := recapLines(s.pending[key]); len(msgs) > 0 {
			s.recap = append(s.recap, e.Test+":\n"+strings.Join(msgs, ""))
		}
		delete(s.pending, key)
	case e.Action == "skip":
		s.pkg(e.Package).skip++
		fmt.Fprint(s.out, skipReason(s.pending[key]))
		delete(s.pending, key)
	}
}

// packageEvent prints a package's own lines: its result ("ok", "FAIL", "?"), panics and TestMain
// output; "PASS" and the test binary's chatter are left out.
func (s *summary) packageEvent(e event) {
	switch e.Action {
	case "fail":
		s.failed = true
		s.pkg(e.Package).seconds = e.Elapsed
	case "pass", "skip":
		s.pkg(e.Package).seconds = e.Elapsed
	case "output":
		if t := strings.TrimSpace(e.Output); t == "PASS" || t == "FAIL" || strings.HasPrefix(t, "=== ") {
			return
		}
		fmt.Fprint(s.out, e.Output)
	}
}

// skipReason is the "--- SKIP" line of a skipped test and the message under it.
func skipReason(lines []string) string {
	var b strings.Builder
	keep := false
	for _, l := range lines {
		if strings.Contains(l, "--- SKIP") {
			keep = true
		}
		if keep {
			b.WriteString(l)
		}
	}
	return b.String()
}

// message is the first line of a test's t.Log, t.Error or t.Fatal output: "    file_test.go:12: ".
var message = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)

// Bounds of a recap: the lines kept of each message and their length.
const (
	recapMessageLines = 3
	recapLineChars    = 400
)

// recapLines returns the messages of a failed test's output, each cut to recapMessageLines lines of
// recapLineChars characters. Subtests' messages stay with their own test; a log dumped into a message
// (an agent's log tail) is cut with it.
func recapLines(out []string) []string {
	var msgs []string
	kept := 0
	for _, l := range out {
		switch {
		case message.MatchString(l):
			kept = 1
		case kept > 0 && kept < recapMessageLines && !strings.HasPrefix(strings.TrimSpace(l), "--- "):
			kept++
		default:
			kept = 0
			continue
		}
		if len(l) > recapLineChars {
			l = l[:recapLineChars] + " …\n"
		}
		msgs = append(msgs, l)
	}
	return msgs
}

// report prints the table and the closing line; it returns whether everything passed.
func (s *summary) report() bool {
	names := make([]string, 0, len(s.pkgs))
	var total counts
	for n, c := range s.pkgs {
		names = append(names, n)
		total.run += c.run
		total.pass += c.pass
		total.fail += c.fail
		total.skip += c.skip
	}
	sort.Strings(names)
	if len(s.recap) > 0 {
		fmt.Fprintln(s.out, "\nwhy each test failed (its messages, cut; the whole output is above):")
		for _, r := range s.recap {
			fmt.Fprint(s.out, r)
		}
	}
	fmt.Fprintln(s.out, "\ntests per suite (subtests included) and the seconds each package ran:")
	w := tabwriter.NewWriter(s.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "ran\tpassed\tfailed\tskipped\tseconds\t\tpackage")
	for _, n := range names {
		c := s.pkgs[n]
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%.1f\t\t%s\n", c.run, c.pass, c.fail, c.skip, c.seconds, n)
	}
	fmt.Fprintf(w, "%d\t%d\t%d\t%d\t\t\t%s\n", total.run, total.pass, total.fail, total.skip, "total")
	w.Flush()
	fmt.Fprintf(s.out, "%d passed, %d failed, %d skipped\n", total.pass, total.fail, total.skip)
	return total.fail == 0 && !s.failed
}

func main() {
	s := newSummary(os.Stdout)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<28)
	for sc.Scan() {
		s.line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if !s.report() {
		os.Exit(1)
	}
}
