package neighbourtable

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// Granule: a raised gc_thresh3 is a multiple of it.
const Granule = 1024

// StateFile is the name of the state file under Config.StateDir.
const StateFile = ID + ".json"

// Thresh is the sysctl of gc_thresh n (1, 2, 3) of family: net.ipv4.neigh.default.gc_thresh3.
func Thresh(family rules.Family, n int) string {
	v := "ipv4"
	if family == rules.IPv6 {
		v = "ipv6"
	}
	return fmt.Sprintf("net.%s.neigh.default.gc_thresh%d", v, n)
}

// Settings are the parsed options.
type Settings = Config

func parse(c Config) (Settings, error) {
	switch {
	case c.RaiseAt <= 0 || c.RaiseAt > 1:
		return c, fix.Invalid("raiseAt", "%v is not a share of gc_thresh3 between 0 (exclusive) and 1", c.RaiseAt)
	case c.TargetFill <= 0 || c.TargetFill >= c.RaiseAt:
		return c, fix.Invalid("targetFill", "%v is not a share above 0 and below raiseAt %v (a raise must leave the table below raiseAt)", c.TargetFill, c.RaiseAt)
	case c.MaxThresh3 < 1024 || c.MaxThresh3 > 1<<24:
		return c, fix.Invalid("maxThresh3", "%d is not between 1024 (the kernel's default) and 16777216", c.MaxThresh3)
	case c.StateDir != "" && !filepath.IsAbs(c.StateDir):
		return c, fix.Invalid("stateDir", "%q is not an absolute path", c.StateDir)
	}
	return c, nil
}

// Observation is one family's table as the fix reads it.
type Observation struct {
	// Entries is the table's entries, over every network namespace (the global count the kernel
	// compares with gc_thresh3).
	Entries int
	// Thresh are gc_thresh1, 2, 3.
	Thresh [3]int
	// Fulls is how much table_fulls (neighbours the kernel refused) rose since the previous
	// observation (0 on the first).
	Fulls uint64
	// Floor are the fix's own earlier values of gc_thresh1, 2, 3 (0: none), restored when lowered
	// behind its back.
	Floor [3]int
}

// Decision is what one family's thresholds should be.
type Decision struct {
	// Thresh are the gc_thresh1, 2, 3 to hold: never below the observed ones.
	Thresh [3]int
	// Why says what asks for a raise ("" when nothing does); Limited: gc_thresh3 would need more
	// than MaxThresh3.
	Why     string
	Limited bool
}

// Desired decides one family's thresholds from o with the options s. It never lowers one: when the
// entries reach s.RaiseAt of gc_thresh3, or the kernel refused neighbours, gc_thresh3 is raised to
// entries / s.TargetFill (twice gc_thresh3 at least after a refusal), rounded up to Granule, at most
// s.MaxThresh3; gc_thresh2 and gc_thresh1 follow at a half and an eighth of it, the kernel's own
// proportions (128/512/1,024).
func Desired(o Observation, s Settings) Decision {
	var d Decision
	for i := range d.Thresh {
		d.Thresh[i] = max(o.Thresh[i], o.Floor[i])
	}
	t3 := o.Thresh[2]
	need := 0
	switch {
	case o.Fulls > 0:
		need = max(2*t3, int(math.Ceil(float64(o.Entries)/s.TargetFill)))
		d.Why = fmt.Sprintf("the kernel refused %d neighbours since the last pass (table_fulls: gc_thresh3 %d reached)", o.Fulls, t3)
	case t3 > 0 && float64(o.Entries) >= s.RaiseAt*float64(t3):
		need = int(math.Ceil(float64(o.Entries) / s.TargetFill))
		d.Why = fmt.Sprintf("%d entries, %.0f%% of gc_thresh3 %d", o.Entries, 100*float64(o.Entries)/float64(t3), t3)
	}
	if need > d.Thresh[2] {
		need = (need + Granule - 1) / Granule * Granule
		if need > s.MaxThresh3 {
			need, d.Limited = s.MaxThresh3, true
		}
		for i, v := range [3]int{need / 8, need / 2, need} {
			d.Thresh[i] = max(d.Thresh[i], v)
		}
	}
	return d
}

// Fix is the neighbour-table fix.
type Fix struct {
	fix.Base[Config, Settings]
	sys nodestate.Sysctl
	// stats reads a family's entries and table_fulls (ReadStats; tests replace it).
	stats func(rules.Family) (entries int, fulls uint64, err error)

	mu      sync.Mutex
	keepers *nodestate.Keepers
	fulls   map[rules.Family]uint64
	last    map[rules.Family]Decision
	raises  map[rules.Family]int
}

var _ fix.Actuator = (*Fix)(nil)

// New builds the fix with its default configuration and registers its metrics. No I/O.
func New(p fix.Params) (*Fix, error) {
	if p.Sysctl == nil {
		return nil, errors.New(ID + ": no nodestate.Sysctl")
	}
	f := &Fix{sys: p.Sysctl, keepers: nodestate.NewKeepers(p.Sysctl, StateFile), stats: ReadStats, fulls: map[rules.Family]uint64{},
		last: map[rules.Family]Decision{}, raises: map[rules.Family]int{}}
	if err := f.Init(spec, p, newMetrics(f)); err != nil {
		return nil, err
	}
	return f, nil
}

// Observe reads family's table: its entries, thresholds and the rise of table_fulls since the
// previous call (f keeps the count), with the fix's earlier values as the floor.
func (f *Fix) observe(family rules.Family, kept map[string]nodestate.Kept) (Observation, error) {
	var o Observation
	entries, fulls, err := f.stats(family)
	if err != nil {
		return o, err
	}
	o.Entries = entries
	if prev, ok := f.fulls[family]; ok && fulls > prev {
		o.Fulls = fulls - prev
	}
	f.fulls[family] = fulls
	for i := range o.Thresh {
		name := Thresh(family, i+1)
		v, err := f.sys.Get(name)
		if err != nil {
			return o, err
		}
		if o.Thresh[i], err = strconv.Atoi(v); err != nil {
			return o, fmt.Errorf("sysctl %s: %q is not a number", name, v)
		}
		if k, ok := kept[name]; ok {
			o.Floor[i], _ = strconv.Atoi(k.Ours)
		}
	}
	return o, nil
}

// Ensure observes both families' tables and raises what Desired asks for (through the Keeper,
// which remembers the values found first). Every pass observes: the tables fill between passes.
// A family the node does not have (IPv6 disabled: no ndisc_cache) is skipped.
func (f *Fix) Ensure(_ context.Context, _ *fix.Snapshot, _ bool) (fix.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := fix.Result{}
	k := f.keepers.In(f.Config().StateDir)
	kept := k.Kept()
	for _, fam := range rules.Families {
		o, err := f.observe(fam, kept)
		if errors.Is(err, os.ErrNotExist) {
			res.Skipped = append(res.Skipped, fix.Skip{Object: string(fam), Reason: "no-table", Detail: err.Error()})
			continue
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", fam, err)
		}
		res.Covered++
		d := Desired(o, f.Config())
		f.last[fam] = d
		want := map[string]string{}
		for i, v := range d.Thresh {
			if v != o.Thresh[i] {
				want[Thresh(fam, i+1)] = strconv.Itoa(v)
			}
		}
		wrote, err := k.Set(want)
		if err != nil {
			return res, fmt.Errorf("%s: %w", fam, err)
		}
		if len(wrote) == 0 {
			continue
		}
		if d.Why == "" {
			res.Repaired = true
			continue
		}
		res.Changed = true
		f.raises[fam]++
		f.Log.Info("raised the neighbour table's thresholds", "family", fam, "why", d.Why,
			"gc_thresh1", d.Thresh[0], "gc_thresh2", d.Thresh[1], "gc_thresh3", d.Thresh[2], "from", o.Thresh[2], "limited", d.Limited)
	}
	return res, nil
}

// Revert puts back the values found before the fix's first raise, where the sysctls still hold the
// fix's values.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.keepers.Revert(f.Config().StateDir, f.Log, "the neighbour tables' thresholds")
	clear(f.last)
	return err
}

// ReadStats reads family's table statistics from /proc/net/stat/arp_cache (IPv4) or ndisc_cache
// (IPv6) of the calling thread's network namespace: the entries (global: every namespace's, the
// count the kernel holds against gc_thresh3; the same on every per-CPU line) and table_fulls
// summed over the CPUs. A missing file wraps os.ErrNotExist.
func ReadStats(family rules.Family) (int, uint64, error) {
	name := "arp_cache"
	if family == rules.IPv6 {
		name = "ndisc_cache"
	}
	dir := "/proc/thread-self/net/stat"
	if _, err := os.Stat(dir); err != nil {
		dir = "/proc/net/stat"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, 0, err
	}
	return ParseStats(string(b))
}

// ParseStats reads the text of a /proc/net/stat/*_cache file: a header naming the columns, then
// one line of hexadecimal numbers per CPU.
func ParseStats(text string) (int, uint64, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 2 {
		return 0, 0, fmt.Errorf("neighbour statistics: no per-CPU lines in %q", text)
	}
	cols := strings.Fields(lines[0])
	ie, ifull := -1, -1
	for i, c := range cols {
		switch c {
		case "entries":
			ie = i
		case "table_fulls":
			ifull = i
		}
	}
	if ie < 0 || ifull < 0 {
		return 0, 0, fmt.Errorf("neighbour statistics: no entries or table_fulls column in %q", lines[0])
	}
	entries, fulls := 0, uint64(0)
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != len(cols) {
			return 0, 0, fmt.Errorf("neighbour statistics: line %q does not match the header", l)
		}
		e, err1 := strconv.ParseUint(f[ie], 16, 64)
		n, err2 := strconv.ParseUint(f[ifull], 16, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("neighbour statistics: %q", l)
		}
		entries, fulls = int(e), fulls+n
	}
	return entries, fulls, nil
}

// state is the last decision per family and the raises (metrics).
func (f *Fix) state() (map[rules.Family]Decision, map[rules.Family]int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, r := map[rules.Family]Decision{}, map[rules.Family]int{}
	for k, v := range f.last {
		d[k] = v
	}
	for k, v := range f.raises {
		r[k] = v
	}
	return d, r
}

// Options are the fix's settings for options as configured (the defaults where unset): what
// `diagnose` judges with.
func Options(options map[string]any) (Settings, error) {
	c := spec.Default()
	if err := fix.Decode(options, &c); err != nil {
		return Settings{}, err
	}
	return parse(c)
}
