package nodeportreservedports

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/inputs"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
)

// The sysctls: both per network namespace, and both apply to IPv6 too.
const (
	LocalPortRange = "net.ipv4.ip_local_port_range"
	ReservedPorts  = "net.ipv4.ip_local_reserved_ports"
)

// StateFile is the name of the state file under Config.StateDir.
const StateFile = ID + ".json"

// Range is an inclusive range of ports.
type Range struct{ From, To int }

func (r Range) String() string {
	if r.From == r.To {
		return strconv.Itoa(r.From)
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Settings are the parsed options.
type Settings struct {
	NodePorts Range
	Reserve   string
	StateDir  string
}

func parse(c Config) (Settings, error) {
	s := Settings{Reserve: c.Reserve, StateDir: c.StateDir}
	rs, err := ParsePorts(c.NodePortRange)
	if err != nil || len(rs) != 1 || rs[0].From < 1 {
		return s, fix.Invalid("nodePortRange", "%q is not a port range such as 30000-32767", c.NodePortRange)
	}
	s.NodePorts = rs[0]
	switch {
	case c.Reserve != ReserveRange && c.Reserve != ReserveInUse:
		return s, fix.Invalid("reserve", "%q is not %s or %s", c.Reserve, ReserveRange, ReserveInUse)
	case c.StateDir != "" && !filepath.IsAbs(c.StateDir):
		return s, fix.Invalid("stateDir", "%q is not an absolute path", c.StateDir)
	}
	return s, nil
}

// ParsePorts reads a port list as ip_local_reserved_ports holds it ("30000-32767,8080"; "" is
// none), or a range as ip_local_port_range holds it ("32768\t60999").
func ParsePorts(text string) ([]Range, error) {
	text = strings.TrimSpace(text)
	if f := strings.Fields(text); len(f) == 2 && !strings.ContainsAny(text, ",-") {
		text = f[0] + "-" + f[1]
	}
	var out []Range
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		from, to, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(from)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(to)
		}
		if err1 != nil || err2 != nil || a < 0 || b > 65535 || a > b {
			return nil, fmt.Errorf("%q is not a port or a port range", part)
		}
		out = append(out, Range{a, b})
	}
	return out, nil
}

// FormatPorts is the canonical text of ports: sorted, merged ranges, as the kernel prints them.
func FormatPorts(ports []Range) string {
	ports = Merge(ports)
	parts := make([]string, len(ports))
	for i, r := range ports {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// Merge sorts ranges and joins those that overlap or touch.
func Merge(in []Range) []Range {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b Range) int { return a.From - b.From })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && r.From <= out[n-1].To+1 {
			out[n-1].To = max(out[n-1].To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}

// Observation is what the fix reads before it decides.
type Observation struct {
	// Ephemeral is ip_local_port_range; Reserved is ip_local_reserved_ports.
	Ephemeral Range
	Reserved  []Range
	// InUse are the NodePorts Services use (reserve: in-use).
	InUse []Range
	// Floor is the fix's own earlier value (restored when removed behind its back).
	Floor []Range
}

// Decision is what ip_local_reserved_ports should hold.
type Decision struct {
	// Reserved is the value to hold: never without a port the observed value has.
	Reserved []Range
	// Overlap are the NodePorts inside the ephemeral range (those the fix reserves); Open, those of
	// them the observed value does not reserve.
	Overlap, Open []Range
}

// Desired decides ip_local_reserved_ports from o with the options s: what it holds, with the
// NodePorts (the range, or those in use) that fall inside the ephemeral range added. It never takes
// a port out.
func Desired(o Observation, s Settings) Decision {
	want := []Range{s.NodePorts}
	if s.Reserve == ReserveInUse {
		want = o.InUse
	}
	var d Decision
	for _, r := range Merge(want) {
		if lo, hi := max(r.From, o.Ephemeral.From), min(r.To, o.Ephemeral.To); lo <= hi {
			d.Overlap = append(d.Overlap, Range{lo, hi})
		}
	}
	d.Open = Subtract(d.Overlap, o.Reserved)
	d.Reserved = Merge(slices.Concat(o.Reserved, o.Floor, d.Overlap))
	return d
}

// Subtract returns the ports of a that b does not hold.
func Subtract(a, b []Range) []Range {
	var out []Range
	b = Merge(b)
	for _, r := range Merge(a) {
		from := r.From
		for _, x := range b {
			if x.To < from || x.From > r.To {
				continue
			}
			if x.From > from {
				out = append(out, Range{from, x.From - 1})
			}
			from = x.To + 1
		}
		if from <= r.To {
			out = append(out, Range{from, r.To})
		}
	}
	return out
}

// Count is how many ports rs holds.
func Count(rs []Range) int {
	n := 0
	for _, r := range Merge(rs) {
		n += r.To - r.From + 1
	}
	return n
}

// InUse are the NodePorts of svcs.
func InUse(svcs []*fix.Service) []Range {
	var out []Range
	for _, s := range svcs {
		for _, p := range s.Ports {
			if p.NodePort > 0 {
				out = append(out, Range{int(p.NodePort), int(p.NodePort)})
			}
		}
	}
	return Merge(out)
}

// Fix is the nodeport-reserved-ports fix.
type Fix struct {
	fix.Base[Config, Settings]
	sys nodestate.Sysctl

	mu      sync.Mutex
	keepers *nodestate.Keepers
	last    Decision
}

var _ fix.Actuator = (*Fix)(nil)

// New builds the fix with its default configuration and registers its metrics. No I/O.
func New(p fix.Params) (*Fix, error) {
	if p.Sysctl == nil {
		return nil, errors.New(ID + ": no nodestate.Sysctl")
	}
	f := &Fix{sys: p.Sysctl, keepers: nodestate.NewKeepers(p.Sysctl, StateFile)}
	if err := f.Init(spec, p, newMetrics(f)); err != nil {
		return nil, err
	}
	return f, nil
}

// Observe reads the two sysctls of the calling thread's network namespace.
func Observe(sys nodestate.Sysctl) (Observation, error) {
	var o Observation
	v, err := sys.Get(LocalPortRange)
	if err != nil {
		return o, err
	}
	eph, err := ParsePorts(v)
	if err != nil || len(eph) != 1 {
		return o, fmt.Errorf("sysctl %s: %q is not a port range", LocalPortRange, v)
	}
	o.Ephemeral = eph[0]
	if v, err = sys.Get(ReservedPorts); err != nil {
		return o, err
	}
	if o.Reserved, err = ParsePorts(v); err != nil {
		return o, fmt.Errorf("sysctl %s: %w", ReservedPorts, err)
	}
	return o, nil
}

// Ensure adds the overlapping NodePorts to ip_local_reserved_ports (through the Keeper, which
// remembers the value found first).
func (f *Fix) Ensure(_ context.Context, snap *fix.Snapshot, _ bool) (fix.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := fix.Result{}
	k := f.keepers.In(f.Config().StateDir)
	o, err := Observe(f.sys)
	if err != nil {
		return res, err
	}
	s := f.Config()
	if s.Reserve == ReserveInUse {
		o.InUse = InUse(inputs.Services.Get(snap))
	}
	if kept, ok := k.Kept()[ReservedPorts]; ok {
		o.Floor, _ = ParsePorts(kept.Ours)
	}
	d := Desired(o, s)
	f.last = d
	res.Covered = Count(d.Overlap)
	want := FormatPorts(d.Reserved)
	if want == FormatPorts(o.Reserved) {
		return res, nil
	}
	if _, err := k.Set(map[string]string{ReservedPorts: want}); err != nil {
		return res, err
	}
	if len(d.Open) == 0 {
		res.Repaired = true // only the fix's own earlier ports were missing
		return res, nil
	}
	res.Changed = true
	f.Log.Info("reserved the NodePorts inside the ephemeral port range", "ports", FormatPorts(d.Open),
		"ephemeral", o.Ephemeral.String(), ReservedPorts, want)
	return res, nil
}

// Revert puts back the value found before the fix's first change, where the sysctl still holds the
// fix's value.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.keepers.Revert(f.Config().StateDir, f.Log, "the reserved ports")
	f.last = Decision{}
	return err
}

func (f *Fix) state() Decision {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
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
