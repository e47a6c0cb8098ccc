package nodeportreservedports

import (
	"context"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit"
)

func TestPorts(t *testing.T) {
	for in, want := range map[string]string{
		"":                                   "",
		"32768\t60999":                       "32768-60999",
		"8080,30000-31000,30500-32767,32768": "8080,30000-32768",
		" 22 , 21":                           "21-22",
	} {
		rs, err := ParsePorts(in)
		if err != nil || FormatPorts(rs) != want {
			t.Errorf("%q: %q %v, want %q", in, FormatPorts(rs), err, want)
		}
	}
	for _, bad := range []string{"x", "2-1", "70000", "1-2-3"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if got := FormatPorts(Subtract([]Range{{30000, 32767}}, []Range{{30100, 30199}, {32000, 40000}})); got != "30000-30099,30200-31999" {
		t.Errorf("Subtract: %s", got)
	}
}

// Desired reserves only the overlap, keeps every port the value held, and in-use mode reserves the
// NodePorts Services use.
func TestDesired(t *testing.T) {
	s, err := parse(spec.Default())
	if err != nil {
		t.Fatal(err)
	}
	inUse := s
	inUse.Reserve = ReserveInUse
	for name, c := range map[string]struct {
		s                   Settings
		o                   Observation
		reserved, open, ovl string
	}{
		"the kernel's defaults":   {s, Observation{Ephemeral: Range{32768, 60999}}, "", "", ""},
		"1024-65535":              {s, Observation{Ephemeral: Range{1024, 65535}}, "30000-32767", "30000-32767", "30000-32767"},
		"keeps others' ports":     {s, Observation{Ephemeral: Range{1024, 65535}, Reserved: []Range{{10250, 10250}, {30000, 30100}}}, "10250,30000-32767", "30101-32767", "30000-32767"},
		"partial overlap":         {s, Observation{Ephemeral: Range{31000, 60999}}, "31000-32767", "31000-32767", "31000-32767"},
		"in use":                  {inUse, Observation{Ephemeral: Range{1024, 65535}, InUse: []Range{{30080, 30080}, {31443, 31443}}}, "30080,31443", "30080,31443", "30080,31443"},
		"in use, gone from use":   {inUse, Observation{Ephemeral: Range{1024, 65535}, Reserved: []Range{{30080, 30080}}, Floor: []Range{{30080, 30080}}}, "30080", "", ""},
		"removed behind its back": {s, Observation{Ephemeral: Range{1024, 65535}, Floor: []Range{{30000, 32767}}}, "30000-32767", "30000-32767", "30000-32767"},
	} {
		d := Desired(c.o, c.s)
		if FormatPorts(d.Reserved) != c.reserved || FormatPorts(d.Open) != c.open || FormatPorts(d.Overlap) != c.ovl {
			t.Errorf("%s: reserved %q open %q overlap %q, want %q %q %q", name, FormatPorts(d.Reserved), FormatPorts(d.Open), FormatPorts(d.Overlap), c.reserved, c.open, c.ovl)
		}
	}
}

func TestEnsureAndRevert(t *testing.T) {
	e := testkit.NewFixEnv(t, New, map[string]any{"stateDir": t.TempDir(), "reserve": "in-use"})
	e.Sysctl.Values[LocalPortRange] = "1024\t65535"
	e.Sysctl.Values[ReservedPorts] = "10250"
	svc := testkit.Service("shop", "web", testkit.NodePortType(), testkit.Ports(testkit.TCP(80)))
	svc.Spec.Ports[0].NodePort = 31080
	res := e.Ensure(testkit.Snapshot(testkit.WithServices(svc)), true)
	if !res.Changed || e.Sysctl.Values[ReservedPorts] != "10250,31080" {
		t.Fatalf("Ensure: %+v, reserved %q", res, e.Sysctl.Values[ReservedPorts])
	}
	e.Sysctl.Values[ReservedPorts] = "10250" // someone took it out
	if res := e.Ensure(testkit.Snapshot(), true); !res.Repaired || e.Sysctl.Values[ReservedPorts] != "10250,31080" {
		t.Errorf("after the Service left and the port was taken out: %+v, reserved %q", res, e.Sysctl.Values[ReservedPorts])
	}
	if err := e.Fix.Revert(context.Background()); err != nil || e.Sysctl.Values[ReservedPorts] != "10250" {
		t.Errorf("Revert: %v, reserved %q", err, e.Sysctl.Values[ReservedPorts])
	}
}

func TestConfigErrors(t *testing.T) {
	e := testkit.NewFixEnv(t, New, nil)
	for key, val := range map[string]any{"nodePortRange": "30000-", "reserve": "all", "stateDir": "x"} {
		e.ConfigureFails(testkit.Snapshot(), map[string]any{key: val}, key)
	}
}

// A fix disabled by a reload sees its options fall back to the defaults (another stateDir): it
// still reverts from the record it made (TestNodeConditions found the reservation left behind).
func TestRevertAfterTheStateDirChanged(t *testing.T) {
	e := testkit.NewFixEnv(t, New, map[string]any{"stateDir": t.TempDir()})
	e.Sysctl.Values[LocalPortRange] = "1024\t65535"
	e.Sysctl.Values[ReservedPorts] = ""
	if res := e.Ensure(testkit.Snapshot(), true); !res.Changed || e.Sysctl.Values[ReservedPorts] != "30000-32767" {
		t.Fatalf("Ensure: %+v, reserved %q", res, e.Sysctl.Values[ReservedPorts])
	}
	e.Configure(map[string]any{"stateDir": t.TempDir()})
	if err := e.Fix.Revert(context.Background()); err != nil || e.Sysctl.Values[ReservedPorts] != "" {
		t.Errorf("Revert after the state directory changed: %v, reserved %q, want it empty again", err, e.Sysctl.Values[ReservedPorts])
	}
}
