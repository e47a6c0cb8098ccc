// Command sampler is the cluster lane's rule sampler (e2e/cluster, day 2's rolling upgrade): run on a
// node (the guest shares this machine's root, so the test builds it and starts it over the node's
// command shell), it records the agent's rules as a baseline, then takes a sample every 100 ms and
// records, per rule set (IPv4, IPv6), how many samples lacked a rule of the baseline and the longest
// stretch during which one was absent.
//
//	sampler run DIR [INTERVAL]   baseline to DIR/baseline, sample until DIR/stop exists, then write
//	                             DIR/summary, the first lacking samples to DIR/missing, and DIR/done
//	sampler check DIR            one sample now; print the baseline's lines it lacks
//
// It reads nf_tables over netlink, one dump of the rules (and, of the agent's nnm-* tables, the sets
// and their elements), between two reads of the ruleset's generation: a dump that a change
// interrupted is taken again, so a sample is one consistent ruleset. That covers the nftables backend
// and iptables-nft (whose tables are nf_tables), a few milliseconds a sample where iptables-nft-save
// and nft list ruleset took seconds under emulation. With NNM_SAMPLER_SAVES set (the iptables-legacy
// variant: "iptables-legacy-save ip6tables-legacy-save") the NNM- lines of those commands are
// sampled instead, at whatever rate they allow.
//
// The agent's rules are: every rule and set element of an nnm-* table; in other tables, the rules of
// chains named NNM-* and the rules that jump to them. Counters are left out.
//
// A sample lacks the baseline's rules when it lacks one of its lines. With NNM_SAMPLER_MODE=fixes
// (an upgrade from another release, whose rules may be written differently) a sample lacks them
// when one of the baseline's fixes has no rules in a rule set: a fix has rules in IPv4 (IPv6) when
// its nnm-<fix> table of that family holds a rule, or when a rule commented
// network-node-manager:<fix> jumps to an NNM- chain that holds a rule, in whichever table and form
// either release writes them.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "sampler:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: sampler run DIR [INTERVAL] | sampler check DIR")
	}
	dir := args[1]
	s, err := newSource()
	if err != nil {
		return err
	}
	switch args[0] {
	case "check":
		base, err := readBaseline(filepath.Join(dir, "baseline"))
		if err != nil {
			return err
		}
		cur, err := s.sample()
		if err != nil {
			return err
		}
		for _, l := range lacks(base, cur) {
			fmt.Println(l.text)
		}
		return nil
	case "run":
		interval := 100 * time.Millisecond
		if len(args) > 2 {
			if interval, err = time.ParseDuration(args[2]); err != nil {
				return err
			}
		}
		return sampleUntilStopped(s, dir, interval)
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// line is one rule or set element of the agent's: key identifies it (counters left out), text is
// for people.
type line struct {
	set  string // the rule set: "ip" (IPv4) or "ip6"; "inet" tables count for both
	key  string
	text string
}

// ruleset is a sample: how many of each line.
type ruleset map[line]int

type source interface{ sample() (ruleset, error) }

func newSource() (source, error) {
	if saves := os.Getenv("NNM_SAMPLER_SAVES"); saves != "" {
		return saveSource(strings.Fields(saves)), nil
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &nftSource{c: c}, nil
}

func sampleUntilStopped(s source, dir string, interval time.Duration) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base, err := s.sample()
	if err != nil {
		return err
	}
	if err := writeBaseline(filepath.Join(dir, "baseline"), base); err != nil {
		return err
	}
	sets := map[string]*stats{}
	for l := range base {
		if sets[l.set] == nil {
			sets[l.set] = &stats{}
		}
	}
	var (
		n, lacking int
		intervals  []time.Duration
		took       []time.Duration
		first      = time.Now()
		prev       = first
		report     bytes.Buffer
	)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for range tick.C {
		if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
			break
		}
		t0 := time.Now()
		cur, err := s.sample()
		if err != nil {
			fmt.Fprintf(&report, "@ %d ms: %v\n", t0.Sub(first).Milliseconds(), err)
			lacking++
			continue
		}
		took = append(took, time.Since(t0))
		n++
		intervals = append(intervals, t0.Sub(prev))
		prev = t0
		gone := lacks(base, cur)
		if len(gone) > 0 {
			lacking++
			if lacking <= 5 {
				fmt.Fprintf(&report, "@ %d ms:\n", t0.Sub(first).Milliseconds())
				for _, l := range gone {
					fmt.Fprintln(&report, l.text)
				}
			}
		}
		for name, st := range sets {
			st.observe(name, t0, gone)
		}
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "samples=%d lacking=%d over_ms=%d interval_ms median=%d p99=%d max=%d sample_ms median=%.1f max=%.1f longest_absence_ms=%d",
		n, lacking, prev.Sub(first).Milliseconds(), ms(quantile(intervals, 0.5)), ms(quantile(intervals, 0.99)), ms(quantile(intervals, 1)),
		msf(quantile(took, 0.5)), msf(quantile(took, 1)), longest(sets, prev))
	names := make([]string, 0, len(sets))
	for name := range sets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		st := sets[name]
		st.end(prev)
		fmt.Fprintf(&sum, "\n  %s: %d lines, lacking in %d samples, longest_absence_ms=%d", name, countSet(base, name), st.lacking, st.longest.Milliseconds())
		if os.Getenv("NNM_SAMPLER_MODE") == "fixes" {
			var fixes []string
			for u := range fixUnits(base) {
				if u.set == name {
					fixes = append(fixes, strings.TrimPrefix(u.text, name+": the rules of "))
				}
			}
			sort.Strings(fixes)
			fmt.Fprintf(&sum, ", fixes %s", strings.Join(fixes, " "))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "missing"), report.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary"), []byte(sum.String()+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
}

// stats of one rule set: an absence runs from the last sample that had every line to the first that
// has them again (an upper bound of what was missed between samples).
type stats struct {
	lacking  int
	lastGood time.Time
	absent   bool
	longest  time.Duration
}

func (s *stats) observe(name string, t time.Time, gone []line) {
	lacks := slices.ContainsFunc(gone, func(l line) bool { return l.set == name })
	switch {
	case lacks:
		s.lacking++
		s.absent = true
	case s.absent:
		s.longest = max(s.longest, t.Sub(s.lastGood))
		s.absent = false
		s.lastGood = t
	default:
		s.lastGood = t
	}
}

func (s *stats) end(t time.Time) {
	if s.absent {
		s.longest = max(s.longest, t.Sub(s.lastGood))
		s.absent = false
	}
}

func longest(sets map[string]*stats, t time.Time) int64 {
	var l time.Duration
	for _, s := range sets {
		s.end(t)
		l = max(l, s.longest)
	}
	return l.Milliseconds()
}

func countSet(r ruleset, name string) int {
	n := 0
	for l, c := range r {
		if l.set == name {
			n += c
		}
	}
	return n
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s)-1)+0.5))]
}

// lacks is what cur lacks of base: missing, or missingFixes with NNM_SAMPLER_MODE=fixes.
func lacks(base, cur ruleset) []line {
	if os.Getenv("NNM_SAMPLER_MODE") == "fixes" {
		return missingFixes(base, cur)
	}
	return missing(base, cur)
}

var (
	unitTable   = regexp.MustCompile(`^\S+ (nnm-[a-z0-9-]+) `)                                  // nf_tables: "ip nnm-invalid-drop chain: rule …"
	unitChain   = regexp.MustCompile(`^\S+ \S+ (NNM-[A-Z0-9-]+): rule |: -A (NNM-[A-Z0-9-]+) `) // a rule of an NNM- chain
	unitJump    = regexp.MustCompile(`(?:→ |-j )(NNM-[A-Z0-9-]+)`)
	unitComment = regexp.MustCompile(`network-node-manager:([a-z0-9-]+)`)
)

// fixUnits is, per rule set, the fixes that have rules in r (NNM_SAMPLER_MODE=fixes).
func fixUnits(r ruleset) map[line]bool {
	chains := map[string]bool{} // set + chain holding a rule
	for l := range r {
		if m := unitChain.FindStringSubmatch(l.text); m != nil {
			chains[l.set+" "+m[1]+m[2]] = true
		}
	}
	units := map[line]bool{}
	for l := range r {
		fix := ""
		if m := unitTable.FindStringSubmatch(l.text); m != nil {
			fix = strings.TrimPrefix(m[1], "nnm-")
		} else if j, c := unitJump.FindStringSubmatch(l.text), unitComment.FindStringSubmatch(l.text); j != nil && c != nil && chains[l.set+" "+j[1]] {
			fix = c[1]
		}
		if fix != "" {
			text := l.set + ": the rules of " + fix
			units[line{set: l.set, key: text, text: text}] = true
		}
	}
	return units
}

func missingFixes(base, cur ruleset) []line {
	have := fixUnits(cur)
	var out []line
	for u := range fixUnits(base) {
		if !have[u] {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].text < out[j].text })
	return out
}

// missing is the lines of base that cur has fewer of, in a stable order.
func missing(base, cur ruleset) []line {
	var out []line
	for l, n := range base {
		if cur[l] < n {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].text < out[j].text })
	return out
}

// The baseline file: "set<TAB>key<TAB>count<TAB>text" a line.
func writeBaseline(path string, r ruleset) error {
	var ls []string
	for l, n := range r {
		ls = append(ls, fmt.Sprintf("%s\t%s\t%d\t%s", l.set, l.key, n, l.text))
	}
	sort.Strings(ls)
	return os.WriteFile(path, []byte(strings.Join(ls, "\n")+"\n"), 0o644)
}

func readBaseline(path string) (ruleset, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := ruleset{}
	for _, s := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(s, "\t", 4)
		if len(f) != 4 {
			continue
		}
		var n int
		fmt.Sscan(f[2], &n)
		r[line{set: f[0], key: f[1], text: f[3]}] = n
	}
	return r, nil
}

// saveSource samples the NNM- lines of iptables-save commands (the legacy variant).
type saveSource []string

var saveCounters = regexp.MustCompile(`^\[\d+:\d+\] | \[\d+:\d+\]$`)

func (s saveSource) sample() (ruleset, error) {
	r := ruleset{}
	for _, bin := range s {
		out, err := exec.Command(bin).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bin, err)
		}
		set := "ip"
		if strings.HasPrefix(bin, "ip6") {
			set = "ip6"
		}
		table := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "*") {
				table = l[1:]
			}
			if !strings.Contains(l, "NNM-") {
				continue
			}
			l = saveCounters.ReplaceAllString(l, "")
			r[line{set: set, key: table + " " + l, text: set + " " + table + ": " + l}]++
		}
	}
	return r, nil
}

// nf_tables over netlink (include/uapi/linux/netfilter/nf_tables.h).
const (
	nfnlSubsysNFTables = 10
	msgGetRule         = 7
	msgGetSet          = 10
	msgGetSetElem      = 13
	msgGetGen          = 16

	attrRuleTable       = 1
	attrRuleChain       = 2
	attrRuleExpressions = 4
	attrRuleUserdata    = 7
	attrListElem        = 1
	attrExprName        = 1
	attrExprData        = 2
	attrSetTable        = 1
	attrSetName         = 2
	attrElemListTable   = 1
	attrElemListSet     = 2
	attrElemListElems   = 3
	attrElemKey         = 1
	attrElemData        = 2
	attrElemFlags       = 3
	attrElemUserdata    = 6
	attrElemKeyEnd      = 9
	attrGenID           = 1
	udataRuleComment    = 0
)

var familyNames = map[uint8]string{unix.NFPROTO_IPV4: "ip", unix.NFPROTO_IPV6: "ip6", unix.NFPROTO_INET: "inet"}

type nftSource struct{ c *netlink.Conn }

func (s *nftSource) sample() (ruleset, error) {
	for try := 0; try < 20; try++ {
		g0, err := s.gen()
		if err != nil {
			return nil, err
		}
		r, interrupted, err := s.dump()
		if err != nil {
			return nil, err
		}
		g1, err := s.gen()
		if err != nil {
			return nil, err
		}
		if !interrupted && g0 == g1 {
			return r, nil
		}
	}
	return nil, errors.New("the ruleset changed during 20 dumps in a row")
}

func (s *nftSource) request(msg uint16, family uint8, flags netlink.HeaderFlags, attrs []byte) ([]netlink.Message, error) {
	data := append([]byte{family, unix.NFNETLINK_V0, 0, 0}, attrs...)
	return s.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | msg), Flags: netlink.Request | flags},
		Data:   data,
	})
}

func (s *nftSource) gen() (uint32, error) {
	msgs, err := s.request(msgGetGen, unix.NFPROTO_UNSPEC, 0, nil)
	if err != nil {
		return 0, fmt.Errorf("getgen: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == attrGenID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("getgen: no generation id")
}

// dump reads every rule of every family, and the elements of the nnm-* tables' sets.
func (s *nftSource) dump() (ruleset, bool, error) {
	r := ruleset{}
	interrupted := false
	msgs, err := s.request(msgGetRule, unix.NFPROTO_UNSPEC, netlink.Dump, nil)
	if err != nil {
		return nil, false, fmt.Errorf("dump rules: %w", err)
	}
	for _, m := range msgs {
		interrupted = interrupted || m.Header.Flags&netlink.DumpInterrupted != 0
		if len(m.Data) < 4 {
			continue
		}
		fam, ok := familyNames[m.Data[0]]
		if !ok {
			continue
		}
		table, chain, exprs, names, comment, err := parseRule(m.Data[4:])
		if err != nil {
			return nil, false, err
		}
		ourTable := strings.HasPrefix(table, "nnm-")
		jump := jumpTarget.Find(exprs)
		if !ourTable && !strings.HasPrefix(chain, "NNM-") && jump == nil {
			continue
		}
		h := sha256.Sum256(exprs)
		text := fmt.Sprintf("%s %s %s: rule %s", fam, table, chain, strings.Join(names, ","))
		if jump != nil {
			text += " → " + string(jump)
		}
		if comment == "" {
			comment = string(ruleComment.Find(exprs)) // iptables-nft keeps -m comment as an xt match
		}
		if comment != "" {
			text += fmt.Sprintf(" comment %q", comment)
		}
		key := fmt.Sprintf("%s/%s/%s/%s/%s", fam, table, chain, hex.EncodeToString(h[:8]), comment)
		for _, set := range ruleSets(fam) {
			r[line{set: set, key: key, text: text}]++
		}
	}
	sets, intr, err := s.ourSets()
	if err != nil {
		return nil, false, err
	}
	interrupted = interrupted || intr
	for _, st := range sets {
		elems, intr, err := s.elements(st)
		if err != nil {
			return nil, false, err
		}
		interrupted = interrupted || intr
		for _, e := range elems {
			h := sha256.Sum256(e)
			text := fmt.Sprintf("%s %s: set %s element %s", st.fam, st.table, st.name, hex.EncodeToString(h[:6]))
			for _, set := range ruleSets(st.fam) {
				r[line{set: set, key: text, text: text}]++
			}
		}
	}
	return r, interrupted, nil
}

var (
	jumpTarget  = regexp.MustCompile(`NNM-[A-Z0-9-]+`)
	ruleComment = regexp.MustCompile(`network-node-manager:[a-z0-9-]+|[a-z][a-z0-9-]*/[a-z0-9-]+: [ -~]+`)
)

func ruleSets(fam string) []string {
	if fam == "inet" {
		return []string{"ip", "ip6"}
	}
	return []string{fam}
}

// parseRule returns the rule's table and chain, its expressions with counters left out (the name
// and data of each, concatenated, and the names), and its comment.
func parseRule(b []byte) (table, chain string, exprs []byte, names []string, comment string, err error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return "", "", nil, nil, "", err
	}
	for ad.Next() {
		switch ad.Type() {
		case attrRuleTable:
			table = ad.String()
		case attrRuleChain:
			chain = ad.String()
		case attrRuleUserdata:
			comment = udataComment(ad.Bytes())
		case attrRuleExpressions:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() != attrListElem {
						continue
					}
					nad.Nested(func(ead *netlink.AttributeDecoder) error {
						var name string
						var data []byte
						for ead.Next() {
							switch ead.Type() {
							case attrExprName:
								name = ead.String()
							case attrExprData:
								data = ead.Bytes()
							}
						}
						if name != "counter" {
							names = append(names, name)
							exprs = binary.BigEndian.AppendUint32(exprs, uint32(len(name)))
							exprs = append(exprs, name...)
							exprs = binary.BigEndian.AppendUint32(exprs, uint32(len(data)))
							exprs = append(exprs, data...)
						}
						return nil
					})
				}
				return nil
			})
		}
	}
	return table, chain, exprs, names, comment, ad.Err()
}

// udataComment is the comment in a rule's user data (type-length-value, libnftnl's udata).
func udataComment(b []byte) string {
	for len(b) >= 2 {
		t, n := b[0], int(b[1])
		if len(b) < 2+n {
			break
		}
		if t == udataRuleComment {
			return strings.TrimRight(string(b[2:2+n]), "\x00")
		}
		b = b[2+n:]
	}
	return ""
}

type nftSet struct {
	fam, table, name string
	family           uint8
}

func (s *nftSource) ourSets() ([]nftSet, bool, error) {
	msgs, err := s.request(msgGetSet, unix.NFPROTO_UNSPEC, netlink.Dump, nil)
	if err != nil {
		return nil, false, fmt.Errorf("dump sets: %w", err)
	}
	var out []nftSet
	interrupted := false
	for _, m := range msgs {
		interrupted = interrupted || m.Header.Flags&netlink.DumpInterrupted != 0
		if len(m.Data) < 4 {
			continue
		}
		fam, ok := familyNames[m.Data[0]]
		if !ok {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, false, err
		}
		st := nftSet{fam: fam, family: m.Data[0]}
		for ad.Next() {
			switch ad.Type() {
			case attrSetTable:
				st.table = ad.String()
			case attrSetName:
				st.name = ad.String()
			}
		}
		if strings.HasPrefix(st.table, "nnm-") {
			out = append(out, st)
		}
	}
	return out, interrupted, nil
}

// elements returns each element of st as its key, end, data, flags and user data.
func (s *nftSource) elements(st nftSet) ([][]byte, bool, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(attrElemListTable, st.table)
	ae.String(attrElemListSet, st.name)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, false, err
	}
	msgs, err := s.request(msgGetSetElem, st.family, netlink.Dump, attrs)
	if errors.Is(err, unix.ENOENT) {
		return nil, true, nil // the set went away between the two dumps: the generation differs
	}
	if err != nil {
		return nil, false, fmt.Errorf("dump elements of set %s %s %s: %w", st.fam, st.table, st.name, err)
	}
	var out [][]byte
	interrupted := false
	for _, m := range msgs {
		interrupted = interrupted || m.Header.Flags&netlink.DumpInterrupted != 0
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, false, err
		}
		for ad.Next() {
			if ad.Type() != attrElemListElems {
				continue
			}
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					if nad.Type() != attrListElem {
						continue
					}
					var e []byte
					nad.Nested(func(ead *netlink.AttributeDecoder) error {
						for ead.Next() {
							switch t := ead.Type(); t {
							case attrElemKey, attrElemKeyEnd, attrElemData, attrElemFlags, attrElemUserdata:
								v := ead.Bytes()
								e = append(e, byte(t))
								e = binary.BigEndian.AppendUint32(e, uint32(len(v)))
								e = append(e, v...)
							}
						}
						return nil
					})
					out = append(out, e)
				}
				return nil
			})
		}
		if err := ad.Err(); err != nil {
			return nil, false, err
		}
	}
	return out, interrupted, nil
}
