// Package deploy holds the kustomize base, components, overlays and uninstall manifests. Its tests
// render them the way `kubectl apply -k` does, check them against each other, the agent's command
// line and configuration, and apply them to a real kube-apiserver with server-side dry run, so a
// schema error fails the build.
package deploy

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.uber.org/fx"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/fixes"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackliberal"
	"github.com/network-node-manager/network-node-manager/hack/manifests"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/app"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// ---- kustomize ----

type object struct {
	file string
	doc  []byte
	u    *unstructured.Unstructured
}

func (o object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.u.GetKind(), o.u.GetNamespace(), o.u.GetName(), o.file)
}

// render returns the objects `kubectl apply -k dir` applies, in order: kustomize itself renders
// them (sigs.k8s.io/kustomize/api, the version kubectl embeds; hack/manifests).
func render(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := manifests.Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fromManifests(t, dir, objs)
}

func fromManifests(t *testing.T, file string, objs []manifests.Object) []object {
	t.Helper()
	out := make([]object, 0, len(objs))
	for _, o := range objs {
		out = append(out, object{file: file, doc: o.YAML(), u: &unstructured.Unstructured{Object: o}})
	}
	return out
}

// generatedName is o's name without the content hash kustomize's generator appends (a ConfigMap
// named NAME-<kustomize's hash of its data>), else its name.
func generatedName(o object) string {
	name := o.u.GetName()
	if o.u.GetKind() != "ConfigMap" {
		return name
	}
	data, _, _ := unstructured.NestedStringMap(o.u.Object, "data")
	if base, ok := strings.CutSuffix(name, "-"+manifests.KustomizeHash(data)); ok {
		return base
	}
	return name
}

func objectFromJSON(t *testing.T, file string, data []byte) object {
	t.Helper()
	doc, err := yaml.JSONToYAML(data)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatal(err)
	}
	return object{file: file, doc: doc, u: u}
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func loadFile(t *testing.T, path string) []object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for i, doc := range docSep.Split(string(data), -1) {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			t.Fatalf("%s document %d: apiVersion, kind and metadata.name are required", path, i)
		}
		out = append(out, object{file: path, doc: []byte(doc), u: u})
	}
	return out
}

// typed decodes o strictly into a typed object: a misspelt field fails even without an API server.
func typed[T any](t *testing.T, o object) *T {
	t.Helper()
	v := new(T)
	if err := yaml.UnmarshalStrict(o.doc, v); err != nil {
		t.Fatalf("%s: %v", o, err)
	}
	return v
}

// podSpec is the pod template of a DaemonSet or Job, nil for other kinds.
func podSpec(t *testing.T, o object) *corev1.PodSpec {
	t.Helper()
	switch o.u.GetKind() {
	case "DaemonSet":
		return &typed[appsv1.DaemonSet](t, o).Spec.Template.Spec
	case "Job":
		return &typed[batchv1.Job](t, o).Spec.Template.Spec
	}
	return nil
}

func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.u.GetKind() == kind && (o.u.GetName() == name || generatedName(o) == name) {
			return o
		}
	}
	t.Fatalf("no %s %s among %d objects", kind, name, len(objs))
	return object{}
}

// Every manifest set the docs tell users to apply.
var manifestSets = map[string]func(t *testing.T) []object{
	"base":                func(t *testing.T) []object { return render(t, "base") },
	"overlays/podmonitor": func(t *testing.T) []object { return render(t, "overlays/podmonitor") },
	"overlays/stale-udp-conntrack": func(t *testing.T) []object {
		return render(t, "overlays/stale-udp-conntrack")
	},
	"overlays/monitoring": func(t *testing.T) []object { return render(t, "overlays/monitoring") },
	"overlays/conntrack-liberal": func(t *testing.T) []object {
		return render(t, "overlays/conntrack-liberal")
	},
	"uninstall":     func(t *testing.T) []object { return render(t, "uninstall") },
	"uninstall/job": func(t *testing.T) []object { return render(t, "uninstall/job") },
	"base + components/config-hot-reload": func(t *testing.T) []object {
		return fromManifests(t, "config-hot-reload", kustomizeWith(t, "base", []string{"config-hot-reload"}, nil))
	},
	// The Helm chart (chart_test.go proves it renders what the kustomizations above render).
	"helm chart, every component": func(t *testing.T) []object {
		all := map[string]any{}
		for _, c := range manifests.ChartComponents {
			all[c.Value] = true
		}
		return fromManifests(t, "helm template", helmTemplate(t, map[string]any{"components": all}))
	},
	"helm chart, cleanup": func(t *testing.T) []object {
		return fromManifests(t, "helm template", helmTemplate(t, map[string]any{"cleanup": true}))
	},
}

// ---- static checks ----

func TestBaseObjects(t *testing.T) {
	var got []string
	for _, o := range render(t, "base") {
		got = append(got, o.u.GetKind()+" "+o.u.GetNamespace()+"/"+generatedName(o))
	}
	want := []string{
		"ServiceAccount kube-system/network-node-manager",
		"ClusterRole /network-node-manager",
		"ClusterRoleBinding /network-node-manager",
		"Role kube-system/network-node-manager-kube-proxy-config",
		"RoleBinding kube-system/network-node-manager-kube-proxy-config",
		"Role default/network-node-manager-events",
		"RoleBinding default/network-node-manager-events",
		"ClusterRole /network-node-manager-health",
		"ClusterRoleBinding /network-node-manager-health",
		"ClusterRole /network-node-manager-metrics-reader",
		"ConfigMap kube-system/network-node-manager",
		"DaemonSet kube-system/network-node-manager",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("deploy/base renders\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// The ClusterRole grants exactly Services list/watch, Nodes get/list/watch, ServiceCIDRs list/watch
// (networking.k8s.io, for ipvs-externalip-dnat) and the two reviews behind
// the protected /metrics; the health ClusterRole patch of nodes/status (the Node conditions) and list
// of EndpointSlices (diagnose); the namespaced grants are get on the one ConfigMap kube-system/kube-proxy and
// create/patch of events.k8s.io Events in default (a Node's Events live there); all bind the agent's
// ServiceAccount. The metrics reader role allows get /metrics and nothing else.
func TestLeastPrivilege(t *testing.T) {
	objs := render(t, "base")
	cr := typed[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "network-node-manager"))
	wantCR := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
	if fmt.Sprint(cr.Rules) != fmt.Sprint(wantCR) || cr.AggregationRule != nil {
		t.Errorf("ClusterRole rules = %+v, want exactly %+v", cr.Rules, wantCR)
	}
	reader := typed[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "network-node-manager-metrics-reader"))
	wantReader := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
	if fmt.Sprint(reader.Rules) != fmt.Sprint(wantReader) {
		t.Errorf("metrics reader rules = %+v, want exactly %+v", reader.Rules, wantReader)
	}
	role := typed[rbacv1.Role](t, find(t, objs, "Role", "network-node-manager-kube-proxy-config"))
	wantRole := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"kube-proxy"}, Verbs: []string{"get"}}}
	if fmt.Sprint(role.Rules) != fmt.Sprint(wantRole) || role.Namespace != "kube-system" {
		t.Errorf("Role %s rules = %+v, want exactly %+v", role.Namespace, role.Rules, wantRole)
	}
	evRole := typed[rbacv1.Role](t, find(t, objs, "Role", "network-node-manager-events"))
	wantEv := []rbacv1.PolicyRule{{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}
	if fmt.Sprint(evRole.Rules) != fmt.Sprint(wantEv) || evRole.Namespace != "default" {
		t.Errorf("Role %s/%s rules = %+v, want exactly %+v in default", evRole.Namespace, evRole.Name, evRole.Rules, wantEv)
	}
	health := typed[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "network-node-manager-health"))
	wantHealth := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
	}
	if fmt.Sprint(health.Rules) != fmt.Sprint(wantHealth) || health.AggregationRule != nil {
		t.Errorf("ClusterRole %s rules = %+v, want exactly %+v", health.Name, health.Rules, wantHealth)
	}
	sa := typed[corev1.ServiceAccount](t, find(t, objs, "ServiceAccount", "network-node-manager"))
	subject := rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}
	healthRB := typed[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "network-node-manager-health"))
	crb := typed[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "network-node-manager"))
	rb := typed[rbacv1.RoleBinding](t, find(t, objs, "RoleBinding", "network-node-manager-kube-proxy-config"))
	evRB := typed[rbacv1.RoleBinding](t, find(t, objs, "RoleBinding", "network-node-manager-events"))
	for _, b := range []struct {
		name     string
		ref      rbacv1.RoleRef
		subjects []rbacv1.Subject
		want     rbacv1.RoleRef
	}{
		{"ClusterRoleBinding", crb.RoleRef, crb.Subjects, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: cr.Name}},
		{"RoleBinding", rb.RoleRef, rb.Subjects, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name}},
		{"events RoleBinding", evRB.RoleRef, evRB.Subjects, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: evRole.Name}},
		{"health ClusterRoleBinding", healthRB.RoleRef, healthRB.Subjects, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: health.Name}},
	} {
		if b.ref != b.want || len(b.subjects) != 1 || b.subjects[0] != subject {
			t.Errorf("%s: roleRef %+v subjects %+v, want %+v and only %+v", b.name, b.ref, b.subjects, b.want, subject)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	objs := render(t, "base")
	ds := typed[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "network-node-manager"))
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "network-node-manager"))
	sa := typed[corev1.ServiceAccount](t, find(t, objs, "ServiceAccount", "network-node-manager"))
	spec := ds.Spec.Template.Spec
	check := func(ok bool, format string, args ...any) {
		t.Helper()
		if !ok {
			t.Errorf(format, args...)
		}
	}
	check(spec.HostNetwork, "hostNetwork must be true")
	check(spec.PriorityClassName == "system-node-critical", "priorityClassName = %q", spec.PriorityClassName)
	check(len(spec.Tolerations) == 1 && spec.Tolerations[0].Operator == corev1.TolerationOpExists && spec.Tolerations[0].Key == "" &&
		spec.Tolerations[0].Effect == "", "tolerations must be a single {operator: Exists}: %+v", spec.Tolerations)
	check(spec.ServiceAccountName == sa.Name, "serviceAccountName %q, want %q", spec.ServiceAccountName, sa.Name)
	check(ds.Namespace == sa.Namespace && cm.Namespace == sa.Namespace, "DaemonSet, ConfigMap, ServiceAccount in different namespaces")
	us := ds.Spec.UpdateStrategy
	check(us.Type == appsv1.RollingUpdateDaemonSetStrategyType && us.RollingUpdate != nil && us.RollingUpdate.MaxUnavailable != nil &&
		us.RollingUpdate.MaxUnavailable.String() == "1", "updateStrategy = %+v, want maxUnavailable 1 (one node at a time, daemonset.yaml says why)", us)
	check(ds.Spec.Selector != nil && fmt.Sprint(ds.Spec.Selector.MatchLabels) == fmt.Sprint(ds.Spec.Template.Labels),
		"selector %v must equal the pod labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]

	// Node name from the downward API, into the variable the config reads.
	var nodeEnv *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == config.EnvName("nodeName") {
			nodeEnv = &c.Env[i]
		}
	}
	check(nodeEnv != nil && nodeEnv.ValueFrom != nil && nodeEnv.ValueFrom.FieldRef != nil && nodeEnv.ValueFrom.FieldRef.FieldPath == "spec.nodeName",
		"%s must come from fieldRef spec.nodeName: %+v", config.EnvName("nodeName"), nodeEnv)

	// The config file: a ConfigMap volume (no subPath: subPath mounts never see updates) and --config.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	var cfgVol string
	for name, v := range vols {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			cfgVol = name
		}
	}
	m, ok := mounts[cfgVol]
	check(ok && m.SubPath == "" && m.ReadOnly, "ConfigMap %s must be mounted read-only as a directory (no subPath): %+v", cm.Name, m)
	cfgPath := filepath.Join(m.MountPath, "config.yaml")
	cfgEnv := ""
	for _, e := range c.Env {
		if e.Name == "NNM_CONFIG" {
			cfgEnv = e.Value
		}
	}
	check(cfgEnv == cfgPath && !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--config") }),
		"NNM_CONFIG %q, args %v: the environment must name %s, for run and every command exec'd in the container", cfgEnv, c.Args, cfgPath)
	_, hasKey := cm.Data["config.yaml"]
	check(hasKey, "ConfigMap has no config.yaml key")

	// xtables lock shared with the host.
	lock, ok := vols["xtables-lock"]
	check(ok && lock.HostPath != nil && lock.HostPath.Path == "/run/xtables.lock" && lock.HostPath.Type != nil &&
		*lock.HostPath.Type == corev1.HostPathFileOrCreate, "xtables-lock volume = %+v", lock)
	check(mounts["xtables-lock"].MountPath == "/run/xtables.lock" && !mounts["xtables-lock"].ReadOnly, "xtables lock mount = %+v", mounts["xtables-lock"])
	// A soft Go heap limit below the container's memory limit.
	var memlimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			memlimit = e.Value
		}
	}
	check(memlimit != "", "GOMEMLIMIT is not set")
	if q, err := resource.ParseQuantity(strings.TrimSuffix(memlimit, "B")); err != nil || c.Resources.Limits.Memory().Cmp(q) <= 0 {
		t.Errorf("GOMEMLIMIT %q must parse and stay below the memory limit %s (%v)", memlimit, c.Resources.Limits.Memory(), err)
	}
	// The entry budgets were measured at this limit (fix.MaxEntriesPerFixFor), and follow the
	// container's limit, which the agent is told through the downward API (config memoryLimit).
	check(c.Resources.Limits.Memory().Value() == fix.MemoryLimit, "memory limit %s, but fix.MemoryLimit (the budgets' limit) is %d bytes", c.Resources.Limits.Memory(), fix.MemoryLimit)
	var limitRef *corev1.ResourceFieldSelector
	for _, e := range c.Env {
		if e.Name == config.EnvName("memoryLimit") && e.ValueFrom != nil {
			limitRef = e.ValueFrom.ResourceFieldRef
		}
	}
	check(limitRef != nil && limitRef.ContainerName == c.Name && limitRef.Resource == "limits.memory" && (limitRef.Divisor.IsZero() || limitRef.Divisor.Value() == 1),
		"%s must come from the container's limits.memory in bytes (downward API), got %+v", config.EnvName("memoryLimit"), limitRef)
	// State that survives agent restarts (conntrack-liberal's value to restore), on the node's tmpfs.
	state, ok := vols["state"]
	check(ok && state.HostPath != nil && state.HostPath.Path == "/run/network-node-manager", "state volume = %+v", state)
	check(mounts["state"].MountPath == "/run/network-node-manager" && !mounts["state"].ReadOnly, "state mount = %+v", mounts["state"])

	// Protected metrics on the port metricsAddress names, plain probes on the port of healthzAddress.
	cfg := loadConfigMap(t, cm)
	check(cfg.MetricsSecure, "deploy/base must serve /metrics protected (metricsSecure: true)")
	ports := map[string]string{}
	for _, p := range c.Ports {
		ports[p.Name] = fmt.Sprint(p.ContainerPort)
	}
	for name, addr := range map[string]string{"metrics": cfg.MetricsAddress, "healthz": cfg.HealthzAddress} {
		_, port, err := net.SplitHostPort(addr)
		check(err == nil && ports[name] == port, "containerPort %s = %s, config address %q", name, ports[name], addr)
	}
	ann := ds.Spec.Template.Annotations
	check(ann["prometheus.io/port"] == ports["metrics"] && ann["prometheus.io/scheme"] == "https",
		"prometheus.io annotations %v, want port %s and scheme https", ann, ports["metrics"])
	// The probes on the node's loopback (issue #63 row 2): a Pod cannot reach the listener, so no
	// flood of Pod connections can keep the kubelet's out.
	host, _, _ := net.SplitHostPort(cfg.HealthzAddress)
	check(net.ParseIP(host).IsLoopback(), "healthzAddress %q, want the node's loopback (127.0.0.1:…)", cfg.HealthzAddress)
	for name, p := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		check(p != nil && p.HTTPGet != nil && p.HTTPGet.Path == name && p.HTTPGet.Port.String() == "healthz" &&
			p.HTTPGet.Host == host && p.HTTPGet.Scheme != corev1.URISchemeHTTPS,
			"probe %s = %+v, want plain HTTP on the healthz port of host %s", name, p, host)
	}

	// Resources and privileges.
	check(!c.Resources.Requests.Cpu().IsZero() && !c.Resources.Requests.Memory().IsZero() && !c.Resources.Limits.Memory().IsZero(),
		"requests cpu/memory and a memory limit are required: %+v", c.Resources)
	checkSecurity(t, c, "agent")
	check(spec.Containers[0].Image == "network-node-manager:"+releaseVersion(t), "image %q: the docs' `kustomize edit set image network-node-manager=…` relies on this name, the tag must be the release", c.Image)
	check(spec.NodeSelector["kubernetes.io/os"] == "linux", "nodeSelector %v, want kubernetes.io/os: linux", spec.NodeSelector)
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			check(!strings.HasPrefix(v.HostPath.Path, "/proc"), "volume %s mounts the node's %s: only components/conntrack-liberal may", v.Name, v.HostPath.Path)
		}
	}
}

// releaseVersion is CHANGELOG.md's latest release, as hack/version.sh reads it (the one parser).
func releaseVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../hack/version.sh", "--latest").Output()
	if err != nil {
		t.Fatalf("hack/version.sh --latest: %v", err)
	}
	v := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("hack/version.sh --latest = %q, want vX.Y.Z", v)
	}
	return v
}

// TestImageTagIsTheRelease: every container of every manifest set the docs apply — the agent, its
// overlays, both uninstall kustomizations — runs network-node-manager at the release's tag (never
// latest, never untagged), and runs only on Linux nodes. components/release holds the tag once. And
// the image docs/deploy.md tells you to build is that tag, pushed and run by the overlays it writes
// (checkDocsInstall).
func TestImageTagIsTheRelease(t *testing.T) {
	t.Run("docs/deploy.md install and uninstall", func(t *testing.T) { checkDocsInstall(t) })
	want := "network-node-manager:" + releaseVersion(t)
	for _, set := range slices.Sorted(maps.Keys(manifestSets)) {
		pods := 0
		for _, o := range manifestSets[set](t) {
			pod := podSpec(t, o)
			if pod == nil {
				continue
			}
			pods++
			for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				if c.Image != want || c.ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("%s %s: image %q pull policy %q, want %s IfNotPresent", set, c.Name, c.Image, c.ImagePullPolicy, want)
				}
			}
			if pod.NodeSelector["kubernetes.io/os"] != "linux" {
				t.Errorf("%s %s: nodeSelector %v, want kubernetes.io/os: linux", set, o, pod.NodeSelector)
			}
		}
		if pods == 0 {
			t.Errorf("%s: no pod template", set)
		}
	}
}

// The node's /proc/sys/net comes in writable only with components/conntrack-liberal, the one fix
// that writes a sysctl: there the agent mounts it and is pointed at it (NNM_PROC_SYS_PATH); the
// base neither mounts it nor sets procSysPath.
func TestProcSysOnlyWithConntrackLiberal(t *testing.T) {
	base := typed[appsv1.DaemonSet](t, find(t, render(t, "base"), "DaemonSet", "network-node-manager"))
	if cfg := loadConfigMap(t, typed[corev1.ConfigMap](t, find(t, render(t, "base"), "ConfigMap", "network-node-manager"))); cfg.ProcSysPath != "/proc/sys" {
		t.Errorf("the base ConfigMap sets procSysPath %s; the component sets it with the mount", cfg.ProcSysPath)
	}
	if _, ok := podMounts(base.Spec.Template.Spec, base.Spec.Template.Spec.Containers[0])["proc-sys-net"]; ok {
		t.Error("deploy/base mounts proc-sys-net")
	}
	ds := typed[appsv1.DaemonSet](t, find(t, render(t, "overlays/conntrack-liberal"), "DaemonSet", "network-node-manager"))
	c := ds.Spec.Template.Spec.Containers[0]
	m := podMounts(ds.Spec.Template.Spec, c)["proc-sys-net"]
	if m.hostPath != "/proc/sys/net" || m.readOnly || m.mountPath != "/host/proc/sys/net" {
		t.Errorf("overlays/conntrack-liberal mounts proc-sys-net as %+v, want the node's /proc/sys/net writable at /host/proc/sys/net", m)
	}
	if got := agentProcSysPath(t, c); got != "/host/proc/sys" {
		t.Errorf("overlays/conntrack-liberal: the agent's procSysPath is %q, want /host/proc/sys", got)
	}
	// The patch merged into the base's container: everything else is still there.
	if len(c.VolumeMounts) != len(base.Spec.Template.Spec.Containers[0].VolumeMounts)+1 || len(c.Env) != len(base.Spec.Template.Spec.Containers[0].Env)+1 {
		t.Errorf("the patch replaced instead of merging: mounts %v env %v", c.VolumeMounts, c.Env)
	}
}

// agentProcSysPath is the procSysPath the agent container is given through the environment.
func agentProcSysPath(t *testing.T, c corev1.Container) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == config.EnvName("procSysPath") {
			return e.Value
		}
	}
	return ""
}

// checkSecurity: netfilter needs uid 0 but nothing beyond NET_ADMIN (+ NET_RAW for iptables-legacy).
func checkSecurity(t *testing.T, c corev1.Container, what string) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("%s: no securityContext", what)
	}
	if fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" || fmt.Sprint(sc.Capabilities.Add) != "[NET_ADMIN NET_RAW]" {
		t.Errorf("%s: capabilities drop %v add %v, want drop [ALL] add [NET_ADMIN NET_RAW]", what, sc.Capabilities.Drop, sc.Capabilities.Add)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: readOnlyRootFilesystem must be true", what)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation must be false", what)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("%s: must not be privileged", what)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: seccompProfile %+v, want RuntimeDefault (SECURITY.md says so)", what, sc.SeccompProfile)
	}
}

// loadConfigMap loads the shipped config file the way the agent does, and builds the engine with every
// standard fix, so an unknown key or a bad fix option in the ConfigMap fails here.
func loadConfigMap(t *testing.T, cm *corev1.ConfigMap) *config.Config {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg *config.Config
	var e *engine.Engine
	app := fx.New(fx.NopLogger, fixes.Standard, agent.Module,
		fx.Supply(agent.Inputs{Environ: []string{"NNM_CONFIG=" + file, "NNM_NODE_NAME=node-1"}}),
		fx.Supply(&detect.Probes{}),
		fx.Provide(func() backend.Backend { return testkit.NewFakeBackend() }),
		fx.Provide(watch.Offline),
		fx.Populate(&cfg, &e))
	if err := app.Err(); err != nil {
		t.Fatalf("the ConfigMap's config.yaml does not load: %v", err)
	}
	if cfg.ProxyMode != "auto" || cfg.Backend != "auto" || cfg.IptablesVariant != "auto" || cfg.NodeName != "node-1" {
		t.Errorf("shipped config: proxyMode %q backend %q iptablesVariant %q nodeName %q; want auto everywhere and the node name from the environment",
			cfg.ProxyMode, cfg.Backend, cfg.IptablesVariant, cfg.NodeName)
	}
	return cfg
}

// The commands and flags the manifests call exist in the binary.
func TestManifestsCallExistingCommands(t *testing.T) {
	root := app.NewCommand("test", fixes.Standard)
	for set, load := range manifestSets {
		for _, o := range load(t) {
			pod := podSpec(t, o)
			if pod == nil {
				continue
			}
			for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				if len(c.Command) > 0 {
					continue // e.g. sleep in the uninstall DaemonSet
				}
				if len(c.Args) == 0 {
					t.Errorf("%s %s: no subcommand", set, c.Name)
					continue
				}
				cmd, rest, err := root.Find(c.Args)
				if err != nil || cmd == root {
					t.Errorf("%s %s: %v is not a command: %v", set, c.Name, c.Args, err)
					continue
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s %s: %v: %v", set, c.Name, c.Args, err)
				}
				if cmd.Name() == "cleanup" {
					checkSecurity(t, c, set+" "+c.Name)
				}
			}
		}
	}
}

// The PodMonitor scrapes the DaemonSet's pods on their metrics port.
func TestPodMonitorMatchesDaemonSet(t *testing.T) {
	objs := render(t, "overlays/podmonitor")
	pm := find(t, objs, "PodMonitor", "network-node-manager")
	ds := typed[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "network-node-manager"))
	if pm.u.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Errorf("PodMonitor apiVersion %s", pm.u.GetAPIVersion())
	}
	sel, _, _ := unstructured.NestedStringMap(pm.u.Object, "spec", "selector", "matchLabels")
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selector %s=%s does not match the pod labels %v", k, v, ds.Spec.Template.Labels)
		}
	}
	ns, _, _ := unstructured.NestedStringSlice(pm.u.Object, "spec", "namespaceSelector", "matchNames")
	if !slices.Contains(ns, ds.Namespace) {
		t.Errorf("PodMonitor namespaceSelector %v misses %s", ns, ds.Namespace)
	}
	eps, _, _ := unstructured.NestedSlice(pm.u.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("podMetricsEndpoints = %v, want one", eps)
	}
	ep := eps[0].(map[string]any)
	secret, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
	if ep["port"] != "metrics" || ep["scheme"] != "https" || secret == "" {
		t.Errorf("podMetricsEndpoint = %v, want port metrics, scheme https and a bearer token Secret", ep)
	}
	// The token Secret belongs to a ServiceAccount bound to the metrics reader role.
	s := typed[corev1.Secret](t, find(t, objs, "Secret", secret))
	sa := s.Annotations[corev1.ServiceAccountNameKey]
	if s.Type != corev1.SecretTypeServiceAccountToken || s.Namespace != pm.u.GetNamespace() || sa == "" {
		t.Errorf("Secret %s/%s: type %s, service account %q; want a token Secret in the PodMonitor's namespace", s.Namespace, s.Name, s.Type, sa)
	}
	find(t, objs, "ServiceAccount", sa)
	crb := typed[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", sa))
	if crb.RoleRef.Name != "network-node-manager-metrics-reader" || len(crb.Subjects) != 1 ||
		crb.Subjects[0].Name != sa || crb.Subjects[0].Namespace != s.Namespace {
		t.Errorf("ClusterRoleBinding %s = %+v, want %s bound to network-node-manager-metrics-reader", crb.Name, crb, sa)
	}
}

// ---- against a real kube-apiserver ----

func TestManifestsAgainstAPIServer(t *testing.T) {
	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	a, err := agenttest.NewApplier(cp.AdminRESTConfig())
	if err != nil {
		t.Fatal(err)
	}

	names := make([]string, 0, len(manifestSets))
	for n := range manifestSets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, set := range names {
		t.Run("dry-run/"+set, func(t *testing.T) {
			for _, o := range manifestSets[set](t) {
				err := a.Apply(ctx, o.u, true)
				if errors.Is(err, agenttest.ErrKindNotServed) && o.u.GroupVersionKind().Group == "monitoring.coreos.com" {
					t.Logf("%s: CRD not installed here; checked structurally (TestPodMonitorMatchesDaemonSet, TestPrometheusRules)", o)
					continue
				}
				if err != nil {
					t.Errorf("server-side dry run of %s: %v", o, err)
				}
			}
		})
	}

	// The dry run can fail: a misspelt field is rejected by the server.
	t.Run("dry-run rejects a schema error", func(t *testing.T) {
		o := find(t, render(t, "base"), "DaemonSet", "network-node-manager")
		bad := object{file: o.file, u: o.u.DeepCopy()}
		spec := bad.u.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		spec["hostNetwrok"] = true
		if err := a.Apply(ctx, bad.u, true); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
			t.Errorf("applying a DaemonSet with spec.template.spec.hostNetwrok: err = %v, want a schema error naming the field", err)
		}
	})

	// Apply the base for real (what `kubectl apply -k deploy/base` does) and check what the agent's
	// ServiceAccount may do with it.
	t.Run("apply base and check the agent's access", func(t *testing.T) {
		for _, o := range render(t, "base") {
			if err := a.Apply(ctx, o.u, false); err != nil {
				t.Fatalf("apply %s: %v", o, err)
			}
		}
		cs := agentClient(t, cp)
		allowed := map[string]func() error{
			"list services": func() error { _, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err },
			"watch nodes": func() error {
				w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=node-1"})
				if err == nil {
					w.Stop()
				}
				return err
			},
			"get node": func() error {
				_, err := cs.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			},
			// The Events on the Node: created in default, then their series patched.
			"create and patch an event on a node": func() error {
				ev := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "node-1.rbac", Namespace: "default"},
					EventTime: metav1.NowMicro(), Reason: "FixEnabled", Action: "invalid-drop", Type: corev1.EventTypeNormal,
					ReportingController: "network-node-manager", ReportingInstance: "network-node-manager-node-1",
					Regarding: corev1.ObjectReference{Kind: "Node", Name: "node-1", UID: "node-1"}, Note: "fix invalid-drop enabled"}
				if _, err := cs.EventsV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
					return err
				}
				_, err := cs.EventsV1().Events("default").Patch(ctx, ev.Name, types.StrategicMergePatchType,
					[]byte(`{"series":{"count":2,"lastObservedTime":"2026-12-01T00:00:00.000000Z"}}`), metav1.PatchOptions{})
				return err
			},
			// The detect probe as the agent runs it: NotFound here (no kube-proxy), not Forbidden.
			"get kube-proxy configmap": func() error {
				_, found, err := detect.KubeProxyConfigMap(kubetest.From(cs))(ctx)
				if found {
					return errors.New("unexpected kube-proxy ConfigMap")
				}
				return err
			},
		}
		for what, f := range allowed {
			if err := f(); err != nil {
				t.Errorf("%s as the agent: %v", what, err)
			}
		}
		denied := map[string]func() error{
			"list configmaps in kube-system": func() error {
				_, err := cs.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
				return err
			},
			"get another configmap": func() error {
				_, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "network-node-manager", metav1.GetOptions{})
				return err
			},
			"create an event in kube-system": func() error {
				_, err := cs.EventsV1().Events("kube-system").Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "kube-system"}}, metav1.CreateOptions{})
				return err
			},
			"list events": func() error { _, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{}); return err },
			"delete an event": func() error {
				return cs.EventsV1().Events("default").Delete(ctx, "node-1.rbac", metav1.DeleteOptions{})
			},
			"create a core v1 event": func() error {
				_, err := cs.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "default"}}, metav1.CreateOptions{})
				return err
			},
			"list secrets": func() error { _, err := cs.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err },
			"delete pods":  func() error { return cs.CoreV1().Pods("default").Delete(ctx, "any", metav1.DeleteOptions{}) },
			"list pods":    func() error { _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err },
			"update node": func() error {
				_, err := cs.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.UpdateOptions{})
				return err
			},
			"delete service": func() error {
				return cs.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{})
			},
		}
		for what, f := range denied {
			if err := f(); !apierrors.IsForbidden(err) {
				t.Errorf("%s as the agent: err = %v, want Forbidden", what, err)
			}
		}
	})

	t.Run("protected metrics with the base's RBAC", func(t *testing.T) { checkProtectedMetrics(t, cp, a) })
}

// The stale-udp-conntrack component adds exactly list/watch on Pods for the agent's ServiceAccount,
// in a ClusterRole of its own, so that the base grants no Pod access to agents without the fix.
func TestStaleUDPConntrackComponent(t *testing.T) {
	objs := render(t, "overlays/stale-udp-conntrack")
	cr := typed[rbacv1.ClusterRole](t, find(t, objs, "ClusterRole", "network-node-manager-pods"))
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}
	if fmt.Sprint(cr.Rules) != fmt.Sprint(want) {
		t.Errorf("ClusterRole rules = %+v, want exactly %+v", cr.Rules, want)
	}
	crb := typed[rbacv1.ClusterRoleBinding](t, find(t, objs, "ClusterRoleBinding", "network-node-manager-pods"))
	if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "network-node-manager" || crb.Subjects[0].Namespace != "kube-system" {
		t.Errorf("binding %+v does not bind the agent's ServiceAccount to %s", crb, cr.Name)
	}
}

// The uninstall pods revert conntrack-liberal as overlays/conntrack-liberal runs it: they mount the
// base's state volume (where the fix keeps the value it replaced, at the fix's default stateDir) and
// the node's /proc/sys/net at the same paths, and pass the agent's procSysPath to `cleanup`.
func TestUninstallRevertsNodeState(t *testing.T) {
	objs := render(t, "overlays/conntrack-liberal")
	ds := typed[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "network-node-manager"))
	cfg := loadConfigMap(t, typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "network-node-manager")))
	cfg.ProcSysPath = agentProcSysPath(t, ds.Spec.Template.Spec.Containers[0])
	if dir, ok := cfg.FixOptions(conntrackliberal.ID)["stateDir"]; ok && dir != conntrackliberal.DefaultStateDir {
		t.Errorf("the ConfigMap sets %s.stateDir %v; cleanup (no ConfigMap) reads %s", conntrackliberal.ID, dir, conntrackliberal.DefaultStateDir)
	}
	base := podMounts(ds.Spec.Template.Spec, ds.Spec.Template.Spec.Containers[0])
	if m, ok := base["state"]; !ok || m.mountPath != conntrackliberal.DefaultStateDir {
		t.Errorf("deploy/base mounts the state volume at %q, want the fix's default stateDir %s", m.mountPath, conntrackliberal.DefaultStateDir)
	}
	for _, set := range []string{"uninstall", "uninstall/job"} {
		var pod corev1.PodSpec
		for _, o := range manifestSets[set](t) {
			if p := podSpec(t, o); p != nil {
				pod = *p
			}
		}
		var cleanup *corev1.Container
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			if len(c.Args) > 0 && c.Args[0] == "cleanup" {
				cleanup = &c
			}
		}
		if cleanup == nil {
			t.Errorf("%s: no container runs cleanup", set)
			continue
		}
		if !slices.Contains(cleanup.Args, "--proc-sys-path="+cfg.ProcSysPath) {
			t.Errorf("%s: args %v, want --proc-sys-path=%s (the agent's procSysPath)", set, cleanup.Args, cfg.ProcSysPath)
		}
		got := podMounts(pod, *cleanup)
		for _, name := range []string{"state", "proc-sys-net"} {
			if got[name] != base[name] || base[name].hostPath == "" || got[name].readOnly {
				t.Errorf("%s: volume %s mounted as %+v, want the agent's %+v, writable", set, name, got[name], base[name])
			}
		}
	}
}

type podMount struct {
	mountPath, hostPath string
	readOnly            bool
}

// podMounts maps c's volume mounts by volume name to where they come from on the node.
func podMounts(pod corev1.PodSpec, c corev1.Container) map[string]podMount {
	out := map[string]podMount{}
	for _, m := range c.VolumeMounts {
		pm := podMount{mountPath: m.MountPath, readOnly: m.ReadOnly}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				pm.hostPath = v.HostPath.Path
			}
		}
		out[m.Name] = pm
	}
	return out
}

// #61: a command exec'd in the agent's container (`kubectl exec ds/network-node-manager --
// network-node-manager diagnose`, no flags) reads the configuration `run` reads: the file comes
// from the container's environment, not from run's arguments alone.
func TestExecReadsTheAgentsConfig(t *testing.T) {
	objs := render(t, "base")
	ds := typed[appsv1.DaemonSet](t, find(t, objs, "DaemonSet", "network-node-manager"))
	cm := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "network-node-manager"))
	c := ds.Spec.Template.Spec.Containers[0]
	// The ConfigMap's file, where the container mounts it, here.
	dir := t.TempDir()
	mount := ""
	for _, m := range c.VolumeMounts {
		if m.Name == "config" {
			mount = m.MountPath
		}
	}
	if mount == "" {
		t.Fatal("the container mounts no volume named config")
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cm.Data["config.yaml"]+"acknowledgedChecks: [rp-filter]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := func(s string) string { return strings.ReplaceAll(s, mount, dir) }
	var environ []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			environ = append(environ, e.Name+"="+local(e.Value))
		}
	}
	var ids fix.IDs
	if err := fx.New(fx.NopLogger, fixes.Standard, fx.Invoke(func(in fix.IDs) { ids = in })).Err(); err != nil {
		t.Fatal(err)
	}
	root := app.NewCommand("test", fixes.Standard)
	load := func(args []string) *config.Config {
		t.Helper()
		cmd, rest, err := root.Find(args)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rest {
			rest[i] = local(rest[i])
		}
		if err := cmd.ParseFlags(rest); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(cmd.Flags(), environ, ids.IDs, ids.Legacy...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return cfg
	}
	run, exec := load(slices.Clone(c.Args)), load([]string{"diagnose"})
	if run.File == "" || exec.File != run.File || !slices.Equal(exec.AcknowledgedChecks, run.AcknowledgedChecks) {
		t.Errorf("run %v reads %q (acknowledgedChecks %v), `diagnose` exec'd in the container reads %q (%v): set the file in the environment (NNM_CONFIG)",
			c.Args, run.File, run.AcknowledgedChecks, exec.File, exec.AcknowledgedChecks)
	}
}
