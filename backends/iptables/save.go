package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// dump is a parsed `iptables-save -c`.
type dump struct {
	tables []*table
	// unparsed counts the lines left out because they could not be parsed (see saveParser), the
	// first of them described in firstUnparsed.
	unparsed      int
	firstUnparsed string
}

type table struct {
	name   string
	chains []*chain
	byName map[string]*chain
}

type chain struct {
	name string
	// policy is "-" for user chains and ACCEPT/DROP for built-in ones.
	policy string
	// rules are the rules that matter to us (see keep), not every rule of a user chain.
	rules []*savedRule
	// sum is, for one of our chains, the digest of all its rules (chainState).
	sum uint64
	// n is how many rules the chain holds (kept or not).
	n int
}

// keep reports whether a parsed rule of chain c stays in the dump. Built-in chains keep every rule
// (jump positions are decided there); user chains keep the rules that jump to a chain we manage (ours
// or the predecessor's: ownership, removal, state) and, in our chains, the counted ones (Counters).
// The rest, at 10,000 map entries 10,000 bucket rules of ours per dump (and on a real node every
// rule of kube-proxy's), is only digested: sum.
func (c *chain) keep(r *savedRule) bool {
	return c.builtin() || cleanupMatch(r.target) || (isOurs(c.name) && counted(r.comment))
}

func (c *chain) builtin() bool { return c.policy != "-" }

type savedRule struct {
	chain string
	// spec is everything after "-A CHAIN", as iptables-save printed it (restore-compatible quoting).
	spec    string
	target  string // value of -j or -g
	comment string // value of --comment, unquoted
	packets uint64
	bytes   uint64
}

// line is the rule without counters, as in iptables-save output.
func (r *savedRule) line() string { return "-A " + r.chain + " " + r.spec }

func (d *dump) table(name string) *table {
	for _, t := range d.tables {
		if t.name == name {
			return t
		}
	}
	return nil
}

// parseSave parses iptables-save output, with or without -c: every table and chain, the rules keep
// lets through, and a digest of each of our chains.
func parseSave(out string) (*dump, error) {
	p := newSaveParser()
	for raw := range strings.Lines(out) {
		p.line(raw)
	}
	return p.finish()
}

// lineWriter is an io.Writer that hands each complete line written to it (without its newline,
// valid only during the call) to each, holding only the start of a line not yet ended. It never
// fails: the command's output is consumed to its end.
type lineWriter struct {
	each func(line []byte)
	part []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			w.part = append(w.part, b...)
			break
		}
		line := b[:i]
		if len(w.part) > 0 {
			w.part = append(w.part, line...)
			line = w.part
		}
		w.each(line)
		w.part = w.part[:0]
		b = b[i+1:]
	}
	return n, nil
}

// flush hands over the line left unterminated, if any.
func (w *lineWriter) flush() {
	if len(w.part) > 0 {
		w.each(w.part)
		w.part = nil
	}
}

// saveParser parses iptables-save output line by line. As an io.Writer it takes the output as the
// command writes it, so the dump's text is never held whole; everything it keeps is copied out of
// the lines it was given.
//
// Any text iptables accepts in a foreign rule must not fail the parse, and no foreign line fails
// it: iptables-save prints a comment (or a log prefix) as it is inside double quotes, newlines
// included (`--comment $'evil\nline'` gives the two lines `... --comment "evil` and `line" -j
// ACCEPT`), so a rule line whose quote is still open at its end goes on in the next lines, up to
// maxQuoted bytes (a comment has 255 at most, escapes double them). A line that cannot be parsed
// (a quote that does not close in that span, a rule in an undeclared chain, anything else) is left
// out of the dump and counted in dump.unparsed; in one of our chains it still counts as a rule of
// the chain and goes into its digest, so a Verify sees it as a difference.
type saveParser struct {
	lineWriter
	d    *dump
	cur  *table
	sums map[*chain]*maphash.Hash
	n    int // lines seen
	// open holds the lines of a rule whose quoted argument has not closed yet (copies).
	open      []string
	openBytes int
}

// maxQuoted bounds how far a quoted argument of iptables-save output may span lines: twice the
// longest comment (every byte escaped) and room for the rest of the rule.
const maxQuoted = 2*maxComment + 256

func newSaveParser() *saveParser {
	p := &saveParser{d: &dump{}, sums: map[*chain]*maphash.Hash{}}
	p.each = func(line []byte) { p.line(unsafe.String(unsafe.SliceData(line), len(line))) }
	return p
}

// line parses one line of output (with or without its newline); raw is only valid during the call.
func (p *saveParser) line(raw string) {
	p.n++
	raw = strings.TrimSuffix(raw, "\n")
	if len(p.open) > 0 {
		p.open = append(p.open, strings.Clone(raw))
		p.openBytes += len(raw) + 1
		joined := strings.Join(p.open, "\n")
		if _, err := parseRule(strings.TrimSpace(joined)); errors.Is(err, errOpenQuote) {
			if p.openBytes > maxQuoted {
				p.closeOpen()
			}
			return
		}
		p.open, p.openBytes = nil, 0
		p.logical(joined)
		return
	}
	p.logical(raw)
}

// closeOpen gives up on the open quote: its first line is unparsable, the lines after it are parsed
// again on their own.
func (p *saveParser) closeOpen() {
	lines := p.open
	p.open, p.openBytes = nil, 0
	p.unparsable(strings.TrimSpace(lines[0]), errOpenQuote)
	p.n -= len(lines) - 1
	for _, l := range lines[1:] {
		p.line(l)
	}
}

// logical parses one logical line (a rule with quoted newlines is one).
func (p *saveParser) logical(raw string) {
	line := strings.TrimSpace(raw)
	if line == "" || strings.HasPrefix(line, "#") {
		return
	}
	err := p.parse(line)
	switch {
	case err == nil:
	case errors.Is(err, errOpenQuote) && (line[0] == '[' || strings.HasPrefix(line, "-A ")):
		p.open, p.openBytes = []string{strings.Clone(raw)}, len(raw)
	default:
		p.unparsable(line, err)
	}
}

// unparsable leaves a line out of the dump. A rule of one of our chains still counts there (its
// number of rules and its digest), so that it shows as a difference.
func (p *saveParser) unparsable(line string, err error) {
	p.d.unparsed++
	if p.d.firstUnparsed == "" {
		p.d.firstUnparsed = fmt.Sprintf("line %d %.200q: %v", p.n, line, err)
	}
	if p.cur == nil {
		return
	}
	rest := line
	if rest[0] == '[' {
		if end := strings.IndexByte(rest, ']'); end >= 0 {
			rest = strings.TrimSpace(rest[end+1:])
		}
	}
	rest, ok := strings.CutPrefix(rest, "-A ")
	if !ok {
		return
	}
	name, spec, _ := strings.Cut(rest, " ")
	if c := p.cur.byName[name]; c != nil {
		c.n++
		if h := p.sums[c]; h != nil {
			writeRule(h, &savedRule{chain: name, spec: spec})
		}
	}
}

func (p *saveParser) parse(line string) error {
	switch {
	case line[0] == '*':
		p.cur = &table{name: strings.Clone(line[1:]), byName: map[string]*chain{}}
		p.d.tables = append(p.d.tables, p.cur)
	case line == "COMMIT":
		p.cur = nil
	case p.cur == nil:
		return errors.New("outside a table")
	case line[0] == ':':
		f := strings.Fields(line[1:])
		if len(f) < 2 {
			return errors.New("malformed chain declaration")
		}
		c := &chain{name: strings.Clone(f[0]), policy: strings.Clone(f[1])}
		p.cur.chains = append(p.cur.chains, c)
		p.cur.byName[c.name] = c
		if isOurs(c.name) {
			p.sums[c] = newDigest()
			writeChainHead(p.sums[c], c.name)
		}
	default:
		r, err := parseRule(line)
		if err != nil {
			return err
		}
		c := p.cur.byName[r.chain]
		if c == nil {
			return errors.New("rule in undeclared chain")
		}
		c.n++
		if h := p.sums[c]; h != nil {
			writeRule(h, r)
		}
		if c.keep(r) {
			kept, _ := parseRule(strings.Clone(line)) // parsed once already: cannot fail
			c.rules = append(c.rules, kept)
		}
	}
	return nil
}

// finish ends the parse: the line left unterminated, if any, and the digests.
func (p *saveParser) finish() (*dump, error) {
	p.flush()
	for len(p.open) > 0 {
		p.closeOpen()
	}
	for c, h := range p.sums {
		c.sum = h.Sum64()
	}
	return p.d, nil
}

// parseRule parses one rule line: "[packets:bytes] -A CHAIN spec" (counters optional).
func parseRule(line string) (*savedRule, error) {
	r := &savedRule{}
	if line[0] == '[' {
		end := strings.IndexByte(line, ']')
		if end < 0 {
			return nil, errors.New("unterminated counters")
		}
		p, b, ok := strings.Cut(line[1:end], ":")
		var err1, err2 error
		r.packets, err1 = strconv.ParseUint(p, 10, 64)
		r.bytes, err2 = strconv.ParseUint(b, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, errors.New("malformed counters")
		}
		line = strings.TrimSpace(line[end+1:])
	}
	rest, ok := strings.CutPrefix(line, "-A ")
	if !ok {
		return nil, errors.New("expected -A")
	}
	r.chain, r.spec, _ = strings.Cut(rest, " ")
	var prev string
	err := eachArg(r.spec, func(arg string) {
		switch prev {
		case "-j", "-g", "--jump", "--goto":
			r.target = arg
		case "--comment":
			r.comment = arg
		}
		prev = arg
	})
	return r, err
}

// errOpenQuote is a rule whose quoted argument does not close on its line.
var errOpenQuote = errors.New("unterminated quote")

// splitArgs splits a rule spec the way iptables-save writes it: whitespace separates arguments, an
// argument that starts with a double quote is quoted up to the next unescaped one, and inside quotes
// a backslash escapes the next character.
func splitArgs(s string) ([]string, error) {
	var args []string
	err := eachArg(s, func(arg string) { args = append(args, arg) })
	if err != nil {
		return nil, err
	}
	return args, nil
}

// literalAfter are the options whose value iptables-save prints as it is, never quoted: chain names,
// which may hold a double quote (`iptables -N 'a"b'` is accepted; its jumps print as `-j a"b`).
func literalAfter(opt string) bool {
	switch opt {
	case "-A", "-j", "-g", "--jump", "--goto", "--append":
		return true
	}
	return false
}

// eachArg calls fn with each argument of s, split as splitArgs says. An argument without quotes is
// a substring of s: parsing 20,000 saved rules allocates only for quoted ones. A double quote inside
// an argument that did not start with one, or in a chain name (literalAfter), is an ordinary
// character.
func eachArg(s string, fn func(arg string)) error {
	var cur strings.Builder
	start := -1 // start of the current argument while it is a plain substring
	inArg, quoted, escaped, built := false, false, false, false
	prev := ""
	flush := func(end int) {
		if built {
			prev = cur.String()
			cur.Reset()
		} else {
			prev = s[start:end]
		}
		fn(prev)
		inArg, built, start = false, false, -1
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case escaped:
			cur.WriteByte(ch)
			escaped = false
		case quoted && ch == '\\':
			escaped = true
		case quoted && ch == '"':
			quoted = false
		case quoted:
			cur.WriteByte(ch)
		case ch == ' ' || ch == '\t':
			if inArg {
				flush(i)
			}
		case !inArg && ch == '"' && !literalAfter(prev):
			cur.Grow(len(s) - i) // the argument's length at most: one allocation
			quoted, inArg, built = true, true, true
		default:
			if !inArg {
				start = i
			}
			if built {
				cur.WriteByte(ch)
			}
			inArg = true
		}
	}
	if quoted {
		return errOpenQuote
	}
	if inArg {
		flush(len(s))
	}
	return nil
}

// tchain names a chain in a table.
type tchain struct{ table, chain string }

func (c tchain) String() string { return c.table + "/" + c.chain }

// owners derives from the kernel which fix owns which NNM- chain: the roots are the NNM- chains jumped
// to from built-in chains by rules commented "network-node-manager:<fix>", and a fix's loading chain
// (loadingChain) while it holds jumps with that comment; a fix owns its roots and every NNM- chain
// reachable from them by jumps.
func (d *dump) owners() map[tchain]string {
	own := map[tchain]string{}
	for _, t := range d.tables {
		var queue []tchain
		for _, c := range t.chains {
			if !c.builtin() && !isLoading(c.name) {
				continue
			}
			for _, r := range c.rules {
				fix, ok := strings.CutPrefix(r.comment, jumpCommentPrefix)
				if !ok || !isOurs(r.target) || t.byName[r.target] == nil {
					continue
				}
				if !c.builtin() {
					if c.name != loadingChain(fix) {
						continue // another fix's comment in a loading chain: not a mark of either
					}
					if k := (tchain{t.name, c.name}); own[k] == "" {
						own[k] = fix
					}
				}
				k := tchain{t.name, r.target}
				if _, seen := own[k]; !seen {
					own[k] = fix
					queue = append(queue, k)
				}
			}
		}
		for len(queue) > 0 {
			k := queue[0]
			queue = queue[1:]
			for _, r := range t.byName[k.chain].rules {
				if !isOurs(r.target) || t.byName[r.target] == nil {
					continue
				}
				n := tchain{t.name, r.target}
				if _, seen := own[n]; !seen {
					own[n] = own[k]
					queue = append(queue, n)
				}
			}
		}
	}
	return own
}

// owned returns the chains of fix according to the kernel.
func (d *dump) owned(fix string) map[tchain]bool {
	out := map[tchain]bool{}
	for k, f := range d.owners() {
		if f == fix {
			out[k] = true
		}
	}
	return out
}

func (d *dump) has(k tchain) bool { return d.chain(k) != nil }

func (d *dump) chain(k tchain) *chain {
	if t := d.table(k.table); t != nil {
		return t.byName[k.chain]
	}
	return nil
}

// holds says how the kernel differs from what an apply of fix just made of it (nil: it does not):
// a chain missing or holding another number of rules than was rendered, or a jump into one missing,
// altered or standing behind a chain it must precede. Run on the read-back after an apply, it tells
// a record made of our change from one that took in someone else's change committed between our
// restore and the read-back (a flush, a deleted jump). A foreign rule replaced by another in one of
// our chains keeps the count and is not seen here; Verify compares digests later.
func (d *dump) holds(fix string, chains []*rchain, jumps []hookJump, prec precedence) error {
	for _, rc := range chains {
		c := d.chain(rc.key())
		switch {
		case c == nil:
			return fmt.Errorf("chain %s is missing", rc.key())
		case c.n != len(rc.lines):
			return fmt.Errorf("chain %s holds %d rules, %d were applied", rc.key(), c.n, len(rc.lines))
		}
	}
	for _, j := range jumps {
		if !d.hasJump(fix, j, prec) {
			return fmt.Errorf("the jump from %s %s to %s is missing or behind %s", j.table, j.builtin, j.chain, prec.list(tchain{j.table, j.chain}))
		}
	}
	return nil
}

// hasJump reports whether j, as fix renders it, stands in its built-in chain, not behind a chain it
// must precede.
func (d *dump) hasJump(fix string, j hookJump, prec precedence) bool {
	c := d.chain(tchain{j.table, j.builtin})
	if c == nil {
		return false
	}
	spec, found := jumpSpec(fix, j.chain), false
	c.walk(func(r *savedRule, before map[string]bool) bool {
		if r.target == j.chain && r.spec == spec {
			found = !prec.blocked(tchain{j.table, j.chain}, before)
			return false
		}
		return true
	})
	return found
}

// walk calls fn for each rule of c, in order, with the foreign chains (not ours) that the rules
// before it jump to (nil for none), until fn returns false: what decides whether a jump of ours
// stands behind a chain it must precede (precedence.blocked).
func (c *chain) walk(fn func(r *savedRule, before map[string]bool) bool) {
	var before map[string]bool
	for _, r := range c.rules {
		if !fn(r, before) {
			return
		}
		if r.target != "" && !isOurs(r.target) {
			if before == nil {
				before = map[string]bool{}
			}
			before[r.target] = true
		}
	}
}

// kstate is the kernel's view of a set of chains, counters excluded: per chain its declaration and
// rules, and per table every rule elsewhere that jumps to one of them. It is kept per chain so that an
// Apply that rewrites a few chains can update its record from a listing of those chains alone.
type kstate struct {
	own    map[tchain]uint64
	others map[string]string
}

// equal compares two states; unrelated changes (other chains created, other rules inserted) do not
// show in either.
func (s kstate) equal(o kstate) bool {
	if len(s.own) != len(o.own) || len(s.others) != len(o.others) {
		return false
	}
	for k, v := range s.own {
		if w, ok := o.own[k]; !ok || w != v {
			return false
		}
	}
	for k, v := range s.others {
		if w, ok := o.others[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// state is the kernel's view of the given chains (see kstate). A rule elsewhere that jumps to one of
// them is recorded by its text; a jump from a built-in chain is marked when it stands behind a jump to
// a foreign chain that precede says it must precede. Foreign rules inserted before it otherwise leave
// the state as it was: another agent putting its own jump first is not drift.
func (d *dump) state(chains map[tchain]bool, precede precedence) kstate {
	st := kstate{own: map[tchain]uint64{}, others: map[string]string{}}
	for _, t := range d.tables {
		var others strings.Builder
		for _, c := range t.chains {
			k := tchain{t.name, c.name}
			if chains[k] {
				st.own[k] = c.sum
				continue
			}
			c.walk(func(r *savedRule, before map[string]bool) bool {
				if target := (tchain{t.name, r.target}); chains[target] {
					mark := ""
					if c.builtin() && precede.blocked(target, before) {
						mark = " #behind " + precede.list(target)
					}
					fmt.Fprintf(&others, "%s%s\n", r.line(), mark)
				}
				return true
			})
		}
		if others.Len() > 0 {
			st.others[t.name] = others.String()
		}
	}
	return st
}

// precedence is, per hooked chain of a fix (table, kernel name), the foreign chains its jump must
// stand ahead of in its built-in chain (rules.Chain.Precedes).
type precedence map[tchain][]string

func precedenceOf(rs *rules.Ruleset) precedence {
	var p precedence
	for _, c := range rs.Chains {
		if c.Hook == "" || len(c.Precedes) == 0 {
			continue
		}
		if p == nil {
			p = precedence{}
		}
		names := slices.Clone(c.Precedes)
		slices.Sort(names)
		p[tchain{tableOf(c.Type), KernelChain(c.Name)}] = slices.Compact(names)
	}
	return p
}

// blocked reports whether the jump to c, met after jumps to the foreign chains in seen, stands behind
// one it must precede.
func (p precedence) blocked(c tchain, seen map[string]bool) bool {
	for _, f := range p[c] {
		if seen[f] {
			return true
		}
	}
	return false
}

// list is what c must precede, comma-separated ("" for nothing).
func (p precedence) list(c tchain) string { return strings.Join(p[c], ",") }

// chainState is the state of one of our chains: a digest of its name and its rules in order, the
// same as parseSave's sum.
func chainState(name string, rs []*savedRule) uint64 {
	h := newDigest()
	writeChainHead(h, name)
	for _, r := range rs {
		writeRule(h, r)
	}
	return h.Sum64()
}

func writeChainHead(h *maphash.Hash, name string) {
	h.WriteByte(':')
	h.WriteString(name)
	h.WriteByte('\n')
}

func writeRule(h *maphash.Hash, r *savedRule) {
	h.WriteString("-A ")
	h.WriteString(r.chain)
	h.WriteByte(' ')
	h.WriteString(r.spec)
	h.WriteByte('\n')
}

// parseList parses `iptables -S CHAIN` output (a "-N CHAIN" line, then the "-A CHAIN" lines in
// iptables-save's format) into the rules of chain.
func parseList(chain, out string) ([]*savedRule, error) {
	var rs []*savedRule
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line == "-N "+chain || strings.HasPrefix(line, "#") {
			continue
		}
		rest, ok := strings.CutPrefix(line, "-A "+chain+" ")
		if line == "-A "+chain {
			rest, ok = "", true
		}
		if !ok {
			return nil, fmt.Errorf("unexpected line %q listing chain %s", line, chain)
		}
		rs = append(rs, &savedRule{chain: chain, spec: rest})
	}
	return rs, nil
}
