package testkit

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/metrics"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// FixFiles are the files every fix folder has (CONTRIBUTING.md step 2); <pkg> is the folder's name.
var FixFiles = []string{"cell.go", "<pkg>.go", "metrics.go", "<pkg>_test.go", "README.md"}

// FixTree is a folder holding one folder per fix, and the fx modules that register them: what
// Check walks. The project's fixes/ and examples/fixes/ each have one test that calls it, so that a
// new fix is checked without writing a line.
type FixTree struct {
	// Dir is the folder, relative to the calling test's package.
	Dir string
	// Modules register the fixes, one module per fix (e.g. invaliddrop.Module).
	Modules []fx.Option
	// Provide adds constructors for what the fixes need beyond the core's faked dependencies
	// (backend.Backend, nodestate.Sysctl, nodestate.Conntrack, *prometheus.Registry and
	// prometheus.Registerer).
	Provide []any
}

// Check builds every module with fxtest and checks each fix:
//   - it registers exactly one fix whose id is kebab-case and registered as a fix id, and the fix is
//     exactly one of fix.RuleFix and fix.Actuator (fix.As);
//   - its folder (the fix's Go package) holds FixFiles, and every folder of Dir is one of the modules;
//   - its README has ReadmeSections and a yaml example whose fixes.<id> options Configure takes;
//     Configure takes no options (the defaults) and refuses an unknown key, naming it;
//   - every metric it registers on the injected prometheus.Registerer is named
//     nnm_<id with underscores>_… (metrics.Namespace, metrics.Subsystem) and documented in the README,
//     and nothing it exports bypasses the Registerer;
//   - for a RuleFix, with the README's options, the rules it wants for a dual-stack snapshot of every kind of
//     Service (ExampleSnapshot) pass rules.Validate and the fake backend, and what its metrics then
//     export passes promlint.
func (ft FixTree) Check(t *testing.T) {
	t.Helper()
	folders := map[string]bool{}
	for _, m := range ft.Modules {
		be := NewFakeBackend()
		rec := &recordingRegisterer{reg: prometheus.NewPedanticRegistry()}
		var in fix.In
		var ids fix.IDs
		app := fxtest.New(t, m,
			fx.Provide(
				func() backend.Backend { return be },
				func() nodestate.Sysctl { return nodestate.NewFakeSysctl(nil) },
				func() nodestate.Conntrack { return nodestate.NewFakeConntrack() },
				func() *prometheus.Registry { return rec.reg },
				func() prometheus.Registerer { return rec },
			),
			fx.Provide(ft.Provide...),
			fx.Populate(&in, &ids))
		app.RequireStart()
		if len(in.Fixes) != 1 || len(ids.IDs) != 1 || in.Fixes[0].ID() != ids.IDs[0] {
			t.Errorf("a module registers fixes %v with ids %v; want one fix per module", in.Fixes, ids.IDs)
			app.RequireStop()
			continue
		}
		f := in.Fixes[0]
		folder := filepath.Join(ft.Dir, path.Base(pkgPath(f)))
		folders[filepath.Base(folder)] = true
		t.Run(f.ID(), func(t *testing.T) { checkFix(t, f, folder, be, rec) })
		app.RequireStop()
	}
	entries, err := os.ReadDir(ft.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && !folders[e.Name()] {
			t.Errorf("%s: folder %s is no registered fix (add its Module to the list this test checks)", ft.Dir, e.Name())
		}
	}
}

func pkgPath(f fix.Fix) string {
	typ := reflect.TypeOf(f)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return typ.PkgPath()
}

func checkFix(t *testing.T, f fix.Fix, folder string, be *FakeBackend, rec *recordingRegisterer) {
	id := f.ID()
	if !rules.ValidFixID(id) {
		t.Errorf("fix id %q is not kebab-case", id)
	}
	rf, _, err := fix.As(f) // rf is nil for an Actuator (and for a fix that is neither or both)
	if err != nil {
		t.Error(err)
	}
	pkg := filepath.Base(folder)
	for _, name := range FixFiles {
		name = strings.ReplaceAll(name, "<pkg>", pkg)
		if _, err := os.Stat(filepath.Join(folder, name)); err != nil {
			t.Errorf("%s lacks %s (every fix folder has %s)", folder, name, strings.Join(FixFiles, ", "))
		}
	}

	// Options: the README example, the defaults, an unknown key.
	r := ReadREADME(t, filepath.Join(folder, "README.md"), id)
	if err := f.Configure(map[string]any{"noSuchOption": true}); err == nil || !strings.Contains(err.Error(), "noSuchOption") {
		t.Errorf("Configure with an unknown key: error %v, want one naming the key", err)
	}
	if err := f.Configure(map[string]any{}); err != nil {
		t.Errorf("Configure without options (the defaults): %v", err)
	}
	if err := f.Configure(r.Options); err != nil {
		t.Fatalf("the README example's fixes.%s options do not configure the fix: %v", id, err)
	}

	// Metric names and documentation.
	prefix := metrics.Namespace + "_" + metrics.Subsystem(id) + "_"
	names := rec.names()
	if len(names) == 0 {
		t.Errorf("the fix registers no metrics on the injected prometheus.Registerer (metrics.go)")
	}
	for _, n := range names {
		if !strings.HasPrefix(n, prefix) {
			t.Errorf("metric %s is not named %s… (Namespace metrics.Namespace, Subsystem metrics.Subsystem(ID))", n, prefix)
		}
	}
	r.DocumentsMetrics(t, names...)

	// Exercise the fix with the README's options, then lint what its metrics export.
	ctx := context.Background()
	snap := ExampleSnapshot()
	for _, fam := range rules.Families {
		if rf == nil {
			break // an Actuator: no rules
		}
		rs, report, err := rf.Rules(snap, fam)
		if err != nil {
			t.Fatalf("Rules(%s) with the README's options: %v", fam, err)
		}
		if rs != nil {
			if err := rs.Validate(); err != nil {
				t.Errorf("Rules(%s): %v", fam, err)
			}
			if err := Apply(ctx, be, rs); err != nil {
				t.Errorf("the fake backend rejects the %s rules: %v\n%s", fam, err, Format(rs))
			}
		}
		if o, ok := f.(fix.Observer); ok {
			o.Observe(ctx, fam, report)
		}
	}
	Promlint(t, rec.reg)
	mfs, err := rec.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			t.Errorf("metric %s is exported but was not registered on the injected prometheus.Registerer", mf.GetName())
		}
	}
}

// Fakes provides what the core gives fix modules, faked: backend.Backend (a FakeBackend),
// nodestate.Sysctl (a Fake without values), nodestate.Conntrack (an empty Fake), and one
// *prometheus.Registry also provided as
// prometheus.Registerer. For tests that build fix modules with fxtest.
func Fakes() fx.Option {
	return fx.Provide(
		func() backend.Backend { return NewFakeBackend() },
		func() nodestate.Sysctl { return nodestate.NewFakeSysctl(nil) },
		func() nodestate.Conntrack { return nodestate.NewFakeConntrack() },
		prometheus.NewRegistry,
		func(r *prometheus.Registry) prometheus.Registerer { return r },
	)
}

// recordingRegisterer registers on reg and remembers the names of the metrics it was given.
type recordingRegisterer struct {
	reg *prometheus.Registry
	mu  sync.Mutex
	fq  []string
}

var fqNamePattern = regexp.MustCompile(`fqName: "([^"]*)"`)

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var fq []string
	for d := range ch {
		// Desc has no accessor for its name; its String form is stable: Desc{fqName: "…", …}.
		if m := fqNamePattern.FindStringSubmatch(d.String()); m != nil {
			fq = append(fq, m[1])
		}
	}
	if err := r.reg.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.fq = append(r.fq, fq...)
	r.mu.Unlock()
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recordingRegisterer) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

func (r *recordingRegisterer) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.fq)
	slices.Sort(out)
	return slices.Compact(out)
}

// ExampleSnapshot is a dual-stack node (pod CIDRs 10.244.1.0/24 and fd00:10:244:1::/64) and a
// Service of every kind that fixes meet: LoadBalancer with ingress IPs of both families and
// externalTrafficPolicy Local, ClusterIP with spec.externalIPs, NodePort, headless, ExternalName,
// an ingress in ipMode Proxy, TCP, UDP and SCTP ports. For tests that run any fix on a realistic
// cluster.
func ExampleSnapshot() *fix.Snapshot {
	return Snapshot(
		WithNode(Node("node-a", PodCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"))),
		WithProxyMode("ipvs"),
		WithServices(
			Service("default", "web", ClusterIPs("10.96.0.10", "fd00:10:96::10"),
				LoadBalancer("203.0.113.10", "2001:db8:e::10"), ETPLocal(),
				Ports(Named("http", TCP(80)), Named("https", TCP(443)), Named("dns", UDP(53)))),
			Service("default", "ext", ClusterIPs("10.96.0.11"), ExternalIPs("198.51.100.11"),
				Ports(TCP(8080), SCTP(9999))),
			Service("default", "np", NodePortType(), ClusterIPs("10.96.0.12"), Ports(TCP(80))),
			Service("default", "headless", Headless(), Ports(TCP(80))),
			Service("default", "alias", ExternalName("example.com")),
			Service("default", "proxied", ClusterIPs("10.96.0.13"), IngressProxyMode("203.0.113.13"), Ports(TCP(80))),
		),
	)
}
