package conntrackcapacity

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
)

// The sysctls the fix reads and raises. nf_conntrack_max and nf_conntrack_buckets are global: only
// the node's initial network namespace may write them (the agent runs there, hostNetwork).
const (
	Count   = "net.netfilter.nf_conntrack_count"
	Max     = "net.netfilter.nf_conntrack_max"
	Buckets = "net.netfilter.nf_conntrack_buckets"
)

// EntryBytes is what one conntrack entry costs the kernel, for the memory bound: the nf_conntrack
// slab object (320 bytes on Debian 12's 6.1 kernel, x86_64) and its extensions (NAT, labels), with
// slab overhead, rounded up.
const EntryBytes = 384

// KubeProxyLimit is kube-proxy's own cap of maxPerCore × CPUs (pkg/proxy/conntrack, v1.37).
const KubeProxyLimit = 1048576

// Granule: a raised nf_conntrack_max is a multiple of it, so that small changes of the fill do not
// make a new value each pass.
const Granule = 4096

// StateFile is the name of the state file under Config.StateDir.
const StateFile = ID + ".json"

// Settings are the parsed options.
type Settings = Config

func parse(c Config) (Settings, error) {
	switch {
	case c.RaiseAt <= 0 || c.RaiseAt > 1:
		return c, fix.Invalid("raiseAt", "%v is not a fill between 0 (exclusive) and 1", c.RaiseAt)
	case c.TargetFill <= 0 || c.TargetFill >= c.RaiseAt:
		return c, fix.Invalid("targetFill", "%v is not a fill above 0 and below raiseAt %v (a raise must leave the table below raiseAt)", c.TargetFill, c.RaiseAt)
	case c.MaxMemoryPercent <= 0 || c.MaxMemoryPercent > 50:
		return c, fix.Invalid("maxMemoryPercent", "%v is not a share of the node's memory above 0 and at most 50 (percent)", c.MaxMemoryPercent)
	case c.KubeProxyMaxPerCore < 0:
		return c, fix.Invalid("kubeProxyMaxPerCore", "%d is negative (0: kube-proxy does not size the table)", c.KubeProxyMaxPerCore)
	case c.KubeProxyMin < 0:
		return c, fix.Invalid("kubeProxyMin", "%d is negative", c.KubeProxyMin)
	case c.StateDir != "" && !filepath.IsAbs(c.StateDir):
		return c, fix.Invalid("stateDir", "%q is not an absolute path", c.StateDir)
	}
	return c, nil
}

// Observation is what the fix reads of the node before it decides.
type Observation struct {
	// Entries, Max and Buckets are nf_conntrack_count, nf_conntrack_max and nf_conntrack_buckets.
	Entries, Max, Buckets int
	// Lost is how much drop + early_drop rose since the previous observation (0 on the first).
	Lost uint64
	// MemoryBytes and CPUs are the node's (MemTotal, online CPUs); MemoryBytes 0: unknown.
	MemoryBytes uint64
	CPUs        int
	// Floor is the least nf_conntrack_max to hold whatever the fill: the fix's own earlier raise
	// (0: none), so that a value lowered behind its back is restored.
	Floor int
}

// Decision is what the table should hold.
type Decision struct {
	// Max and Buckets are the values to hold: never below the observed ones.
	Max, Buckets int
	// Bound is the most entries the memory bound allows (never below KubeProxy); 0: memory unknown.
	Bound int
	// KubeProxy is what kube-proxy sets at its start (0: it leaves the table alone).
	KubeProxy int
	// Why says what asks for a raise ("" when nothing does).
	Why string
	// Limited: the table needs more than Bound.
	Limited bool
}

// KubeProxyMax is the nf_conntrack_max kube-proxy sets at its start on a node of cpus CPUs with
// conntrack.maxPerCore perCore and conntrack.min least (0: none; it only ever raises the value).
func KubeProxyMax(perCore, least, cpus int) int {
	if perCore <= 0 {
		return 0
	}
	return min(max(perCore*cpus, least), KubeProxyLimit)
}

// Desired decides from o what nf_conntrack_max and nf_conntrack_buckets should hold, with the
// options s. It never lowers a value: a raise is asked for when entries reach s.RaiseAt of the
// maximum (to entries / s.TargetFill) or connections were lost (to twice the maximum at least),
// rounded up to Granule, bounded by s.MaxMemoryPercent of the node's memory in EntryBytes entries
// (or what kube-proxy sets, if that is more); the buckets follow at a quarter of the maximum, as
// kube-proxy keeps them. A value lowered behind the fix's back is raised again to o.Floor.
func Desired(o Observation, s Settings) Decision {
	d := Decision{Max: max(o.Max, o.Floor), Buckets: o.Buckets,
		KubeProxy: KubeProxyMax(s.KubeProxyMaxPerCore, s.KubeProxyMin, o.CPUs)}
	if o.MemoryBytes > 0 {
		d.Bound = max(int(float64(o.MemoryBytes)*s.MaxMemoryPercent/100/EntryBytes), d.KubeProxy)
	}
	need := 0
	switch {
	case o.Lost > 0:
		need = max(2*o.Max, ceil(float64(o.Entries)/s.TargetFill))
		d.Why = fmt.Sprintf("%d connections lost since the last pass (drop, early_drop: the table was full)", o.Lost)
	case o.Max > 0 && float64(o.Entries) >= s.RaiseAt*float64(o.Max):
		need = ceil(float64(o.Entries) / s.TargetFill)
		d.Why = fmt.Sprintf("the table is %.0f%% full (%d of %d)", 100*float64(o.Entries)/float64(o.Max), o.Entries, o.Max)
	}
	if need > d.Max {
		need = (need + Granule - 1) / Granule * Granule
		if d.Bound == 0 || need > d.Bound {
			d.Limited = true
			need = d.Bound
		}
		d.Max = max(d.Max, need)
	}
	if d.Max > o.Max {
		d.Buckets = max(o.Buckets, d.Max/4)
	}
	return d
}

func ceil(f float64) int { return int(math.Ceil(f)) }

// Fix is the conntrack-capacity fix.
type Fix struct {
	fix.Base[Config, Settings]
	sys   nodestate.Sysctl
	stats nodestate.ConntrackStatsReader
	// host reads the node's memory and CPUs (HostInfo; tests replace it).
	host func() (memBytes uint64, cpus int, err error)

	mu       sync.Mutex
	keepers  *nodestate.Keepers
	lost     uint64 // drop + early_drop at the last observation
	seenLost bool
	last     Decision
	raises   int
}

var _ fix.Actuator = (*Fix)(nil)

// New builds the fix with its default configuration and registers its metrics. No I/O.
func New(p fix.Params) (*Fix, error) {
	if p.Sysctl == nil {
		return nil, errors.New(ID + ": no nodestate.Sysctl")
	}
	f := &Fix{sys: p.Sysctl, host: HostInfo, keepers: nodestate.NewKeepers(p.Sysctl, StateFile)}
	if s, ok := p.Conntrack.(nodestate.ConntrackStatsReader); ok {
		f.stats = s
	}
	if err := f.Init(spec, p, newMetrics(f)); err != nil {
		return nil, err
	}
	return f, nil
}

// Observe reads the node: the table's sysctls, the lost-connection counters (rise since the last
// call: f keeps the previous count), the node's memory and CPUs.
func (f *Fix) observe(ctx context.Context) (Observation, error) {
	var o Observation
	for name, dst := range map[string]*int{Count: &o.Entries, Max: &o.Max, Buckets: &o.Buckets} {
		v, err := f.sys.Get(name)
		if err != nil {
			return o, fmt.Errorf("%w (is the nf_conntrack module loaded?)", err)
		}
		if *dst, err = strconv.Atoi(v); err != nil {
			return o, fmt.Errorf("sysctl %s: %q is not a number", name, v)
		}
	}
	if f.stats == nil {
		return o, errors.New("conntrack's statistics cannot be read here")
	}
	st, err := f.stats.Stats(ctx)
	if err != nil {
		return o, fmt.Errorf("conntrack statistics: %w", err)
	}
	lost := st.Drop + st.EarlyDrop
	if f.seenLost && lost > f.lost {
		o.Lost = lost - f.lost
	}
	f.lost, f.seenLost = lost, true
	if o.MemoryBytes, o.CPUs, err = f.host(); err != nil {
		return o, err
	}
	return o, nil
}

// Ensure observes the table and raises what Desired asks for (through the Keeper, which remembers
// the values found first). Every pass observes: the table fills between passes.
func (f *Fix) Ensure(ctx context.Context, _ *fix.Snapshot, _ bool) (fix.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := fix.Result{Report: fix.Report{Covered: 1}}
	k := f.keepers.In(f.Config().StateDir)
	o, err := f.observe(ctx)
	if err != nil {
		return res, err
	}
	kept := k.Kept()
	if v, ok := kept[Max]; ok {
		o.Floor, _ = strconv.Atoi(v.Ours)
	}
	d := Desired(o, f.Config())
	f.last = d
	want := map[string]string{}
	if d.Max != o.Max {
		want[Max] = strconv.Itoa(d.Max)
	}
	if d.Buckets != o.Buckets {
		want[Buckets] = strconv.Itoa(d.Buckets)
	}
	wrote, err := k.Set(want)
	if err != nil {
		return res, err
	}
	if len(wrote) == 0 {
		return res, nil
	}
	if o.Floor > o.Max {
		res.Repaired = true
		return res, nil
	}
	res.Changed = true
	f.raises++
	f.Log.Info("raised the conntrack table", "why", d.Why, "nf_conntrack_max", d.Max, "from", o.Max,
		"nf_conntrack_buckets", d.Buckets, "bound", d.Bound, "limited", d.Limited)
	return res, nil
}

// Revert puts back the values found before the fix's first raise, where the sysctls still hold the
// fix's values.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.keepers.Revert(f.Config().StateDir, f.Log, "the conntrack table's size")
	f.last = Decision{}
	return err
}

// HostInfo reads the node's memory (MemTotal of /proc/meminfo) and its online CPUs.
func HostInfo() (uint64, int, error) {
	fh, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	defer fh.Close()
	s := bufio.NewScanner(fh)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/meminfo: %q", s.Text())
			}
			return kb << 10, runtime.NumCPU(), nil
		}
	}
	return 0, 0, errors.New("/proc/meminfo has no MemTotal")
}

// state is the last decision and how many raises the fix made (metrics).
func (f *Fix) state() (Decision, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.raises
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
