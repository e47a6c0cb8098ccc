package detect

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
)

// fakeNode is a node described by its signals; probes() turns it into Probes. A nil field means the
// signal's probe is absent; an error field makes that probe fail.
type fakeNode struct {
	endpoint    string // body of /proxyMode; "" with endpointErr nil means "connection refused"
	endpointErr error
	links       []string
	nftTables   []string
	nftErr      error
	configMap   *string // config.conf; nil: no ConfigMap
	noClient    bool
	save        map[string]string // "variant/family/table" → output
	saveErr     map[string]error  // variant → error
	conntrackOK bool
}

func (n fakeNode) probes() Probes {
	p := Probes{
		ProxyModeEndpoint: func(context.Context) (string, error) {
			if n.endpoint == "" && n.endpointErr == nil {
				return "", errors.New("dial tcp 127.0.0.1:10249: connect: connection refused")
			}
			return n.endpoint, n.endpointErr
		},
		LinkExists: func(name string) (bool, error) {
			for _, l := range n.links {
				if l == name {
					return true, nil
				}
			}
			return false, nil
		},
		NFTTables: func(context.Context) ([]string, error) { return n.nftTables, n.nftErr },
		IptablesSave: func(_ context.Context, variant, family, table string) (string, error) {
			if err := n.saveErr[variant]; err != nil {
				return "", err
			}
			return n.save[variant+"/"+family+"/"+table], nil
		},
		ConntrackMatch: func(context.Context, string) error {
			if n.conntrackOK {
				return nil
			}
			return errors.New("conntrack match: iptables v1.8.9: Couldn't load match `conntrack'")
		},
	}
	if !n.noClient {
		p.KubeProxyConfigMap = func(context.Context) (string, bool, error) {
			if n.configMap == nil {
				return "", false, nil
			}
			return *n.configMap, true, nil
		}
	}
	return p
}

func str(s string) *string { return &s }

const kubeServices = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n"

func auto() *config.Config {
	c := config.Defaults()
	return &c
}

func TestProxyModeSignalsInPriorityOrder(t *testing.T) {
	ipvsConf := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
	tests := []struct {
		name       string
		node       fakeNode
		mode, src  string
		backend    string
		backendSrc string
	}{
		// Every probe answered and none saw kube-proxy: a node without kube-proxy.
		{"nothing", fakeNode{}, ModeNone, SourceNoKubeProxy, "iptables", SourceDefault},
		{"nothing without API client", fakeNode{noClient: true}, ModeNone, SourceNoKubeProxy, "iptables", SourceDefault},
		{"nothing, a probe failing", fakeNode{nftErr: errors.New("no nf_tables")}, "", SourceUnknown, "iptables", SourceDefault},
		{"nothing, iptables-save failing", fakeNode{saveErr: map[string]error{"legacy": errors.New("not found")}}, "", SourceUnknown, "iptables", SourceDefault},
		{"unexpected answer and nothing else", fakeNode{endpoint: "kernelspace"}, "", SourceUnknown, "iptables", SourceDefault},
		{"KUBE-SERVICES in iptables-nft", fakeNode{save: map[string]string{"nft/ipv4/nat": kubeServices}}, "iptables", SourceKubeServicesChain, "iptables", SourceProxyMode},
		{"KUBE-SERVICES in ip6tables-legacy", fakeNode{save: map[string]string{"legacy/ipv6/nat": kubeServices}}, "iptables", SourceKubeServicesChain, "iptables", SourceProxyMode},
		{"link beats KUBE-SERVICES (IPVS mode has both)", fakeNode{links: []string{"kube-ipvs0"}, save: map[string]string{"nft/ipv4/nat": kubeServices}}, "ipvs", SourceIPVSLink, "iptables", SourceProxyMode},
		{"endpoint ipvs", fakeNode{endpoint: "ipvs"}, "ipvs", SourceMetricsEndpoint, "iptables", SourceProxyMode},
		{"endpoint iptables with trailing newline", fakeNode{endpoint: "iptables\n"}, "iptables", SourceMetricsEndpoint, "iptables", SourceProxyMode},
		{"endpoint nftables selects nftables backend", fakeNode{endpoint: "nftables"}, "nftables", SourceMetricsEndpoint, "nftables", SourceProxyMode},
		// The endpoint is kube-proxy's own answer: it wins over every leftover.
		{"endpoint beats link, table and configmap", fakeNode{endpoint: "iptables", links: []string{"kube-ipvs0"},
			nftTables: []string{"ip kube-proxy"}, configMap: str(ipvsConf)}, "iptables", SourceMetricsEndpoint, "iptables", SourceProxyMode},
		{"garbage from endpoint falls through", fakeNode{endpoint: "<html>404</html>", links: []string{"kube-ipvs0"}}, "ipvs", SourceIPVSLink, "iptables", SourceProxyMode},
		{"endpoint error falls through", fakeNode{endpointErr: errors.New("timeout"), nftTables: []string{"ip6 kube-proxy"}}, "nftables", SourceNFTablesTable, "nftables", SourceProxyMode},
		{"link beats table", fakeNode{links: []string{"kube-ipvs0"}, nftTables: []string{"ip kube-proxy"}}, "ipvs", SourceIPVSLink, "iptables", SourceProxyMode},
		{"other links do not count", fakeNode{links: []string{"eth0", "kube-bridge"}}, ModeNone, SourceNoKubeProxy, "iptables", SourceDefault},
		{"table ip kube-proxy", fakeNode{nftTables: []string{"inet filter", "ip kube-proxy"}}, "nftables", SourceNFTablesTable, "nftables", SourceProxyMode},
		{"table ip6 kube-proxy", fakeNode{nftTables: []string{"ip6 kube-proxy"}}, "nftables", SourceNFTablesTable, "nftables", SourceProxyMode},
		{"inet kube-proxy is not kube-proxy's", fakeNode{nftTables: []string{"inet kube-proxy", "ip nat"}}, ModeNone, SourceNoKubeProxy, "iptables", SourceDefault},
		{"table beats configmap", fakeNode{nftTables: []string{"ip kube-proxy"}, configMap: str(ipvsConf)}, "nftables", SourceNFTablesTable, "nftables", SourceProxyMode},
		// A ConfigMap alone is a leftover (a cluster that replaced kube-proxy keeps it): never the mode.
		{"configmap ipvs, nothing on the node", fakeNode{configMap: str(ipvsConf)}, ModeNone, SourceNoKubeProxy, "iptables", SourceDefault},
		// Only when a probe could not look does the ConfigMap decide.
		{"configmap ipvs, a probe failing", fakeNode{configMap: str(ipvsConf), nftErr: errors.New("no nf_tables")}, "ipvs", SourceConfigMap, "iptables", SourceProxyMode},
		{"configmap empty mode is iptables", fakeNode{nftErr: errors.New("x"), configMap: str("kind: KubeProxyConfiguration\nmode: \"\"\n")}, "iptables", SourceConfigMap, "iptables", SourceProxyMode},
		{"configmap nftables", fakeNode{nftErr: errors.New("x"), configMap: str("mode: nftables\n")}, "nftables", SourceConfigMap, "nftables", SourceProxyMode},
		{"configmap unknown mode", fakeNode{nftErr: errors.New("x"), configMap: str("mode: userspace\n")}, "", SourceUnknown, "iptables", SourceDefault},
		{"configmap ignored without client", fakeNode{nftErr: errors.New("x"), configMap: str(ipvsConf), noClient: true}, "", SourceUnknown, "iptables", SourceDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Resolve(context.Background(), auto(), tt.node.probes(), nil)
			if r.ProxyMode != tt.mode || r.ProxyModeSource != tt.src {
				t.Errorf("proxy mode = %q (%s), want %q (%s); notes: %v", r.ProxyMode, r.ProxyModeSource, tt.mode, tt.src, r.Notes)
			}
			if r.Backend != tt.backend || r.BackendSource != tt.backendSrc {
				t.Errorf("backend = %q (%s), want %q (%s)", r.Backend, r.BackendSource, tt.backend, tt.backendSrc)
			}
		})
	}
}

// ProxyMode says what each probe saw and, when it cannot tell, why: what `diagnose` and the log show.
func TestProxyModeEvidence(t *testing.T) {
	ipvsConf := "kind: KubeProxyConfiguration\nmode: ipvs\n"
	r := ProxyMode(context.Background(), fakeNode{configMap: str(ipvsConf)}.probes())
	if r.Mode != ModeNone || r.Unknown != "" {
		t.Fatalf("ProxyMode = %+v, want %q", r, ModeNone)
	}
	ev := strings.Join(r.Evidence, "\n")
	for _, want := range []string{"metrics endpoint: no answer", "kube-ipvs0 link: absent", "nftables table ip/ip6 kube-proxy: absent",
		"no KUBE-SERVICES chain", "kube-proxy ConfigMap: mode ipvs, but nothing of kube-proxy on this node: a leftover, ignored"} {
		if !strings.Contains(ev, want) {
			t.Errorf("evidence lacks %q:\n%s", want, ev)
		}
	}
	r = ProxyMode(context.Background(), fakeNode{nftErr: errors.New("netlink: operation not permitted")}.probes())
	if r.Mode != "" || r.Source != SourceUnknown || !strings.Contains(r.Unknown, "operation not permitted") {
		t.Errorf("with a failing probe: %+v, want unknown naming the failure", r)
	}
	if r := ProxyMode(context.Background(), Probes{}); r.Mode != "" || r.Unknown == "" {
		t.Errorf("without probes: %+v, want unknown with a reason", r)
	}
}

func TestConfiguredValuesSkipProbes(t *testing.T) {
	cfg := auto()
	cfg.ProxyMode, cfg.Backend, cfg.IptablesVariant = "ipvs", "nftables", "legacy"
	called := []string{}
	p := Probes{
		ProxyModeEndpoint: func(context.Context) (string, error) { called = append(called, "endpoint"); return "iptables", nil },
		LinkExists:        func(string) (bool, error) { called = append(called, "link"); return false, nil },
		KubeProxyConfigMap: func(context.Context) (string, bool, error) {
			called = append(called, "configmap")
			return "", false, nil
		},
		IptablesSave: func(context.Context, string, string, string) (string, error) {
			called = append(called, "save")
			return "", nil
		},
	}
	r := Resolve(context.Background(), cfg, p, nil)
	want := Result{ProxyMode: "ipvs", ProxyModeSource: SourceConfig, Backend: "nftables", BackendSource: SourceConfig,
		IptablesVariant: "legacy", IptablesVariantSource: SourceConfig}
	if fmt.Sprint(r) != fmt.Sprint(want) {
		t.Errorf("Resolve = %+v, want %+v", r, want)
	}
	if len(called) > 0 {
		t.Errorf("probes called although every value is configured: %v", called)
	}
}

func TestNoProbesKeepsConservativeDefaults(t *testing.T) {
	r := Resolve(context.Background(), auto(), Probes{}, nil)
	if r.ProxyMode != "" || r.ProxyModeSource != SourceUnknown || r.Backend != "iptables" || r.IptablesVariant != "nft" ||
		r.IptablesVariantSource != SourceDefault || r.Features != nil {
		t.Errorf("Resolve without probes = %+v", r)
	}
}

const (
	hintChain   = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	canaryOnly  = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
	emptyMangle = "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"
)

func rulesDump(n int) string {
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n:FOO - [0:0]\n")
	for i := range n {
		fmt.Fprintf(&b, "-A INPUT -s 10.0.0.%d/32 -j FOO\n", i)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func TestIptablesVariantLikeIptablesWrappers(t *testing.T) {
	tests := []struct {
		name     string
		save     map[string]string
		saveErr  map[string]error
		variant  string
		source   string
		noProbes bool
	}{
		{name: "nothing anywhere", save: nil, variant: "nft", source: SourceDefault},
		{name: "no save probe", noProbes: true, variant: "nft", source: SourceDefault},
		{name: "hint in nft", save: map[string]string{"nft/ipv4/mangle": hintChain}, variant: "nft", source: SourceHintChain},
		{name: "canary in legacy ipv6 only", save: map[string]string{"legacy/ipv6/mangle": canaryOnly, "nft/ipv4/mangle": emptyMangle},
			variant: "legacy", source: SourceHintChain},
		// The hint is authoritative: more rules in the other variant do not matter.
		{name: "legacy hint beats nft rule count", save: map[string]string{"legacy/ipv4/mangle": hintChain, "nft/ipv4/": rulesDump(50)},
			variant: "legacy", source: SourceHintChain},
		// nft is checked first, as iptables-wrappers does.
		{name: "hints in both: nft", save: map[string]string{"legacy/ipv4/mangle": hintChain, "nft/ipv4/mangle": hintChain},
			variant: "nft", source: SourceHintChain},
		{name: "more legacy rules", save: map[string]string{"legacy/ipv4/": rulesDump(3), "nft/ipv4/": rulesDump(1), "nft/ipv6/": rulesDump(1)},
			variant: "legacy", source: SourceRuleCount},
		{name: "more nft rules", save: map[string]string{"legacy/ipv4/": rulesDump(2), "nft/ipv6/": rulesDump(3)},
			variant: "nft", source: SourceRuleCount},
		{name: "tie goes to nft", save: map[string]string{"legacy/ipv4/": rulesDump(2), "nft/ipv4/": rulesDump(2)},
			variant: "nft", source: SourceRuleCount},
		{name: "legacy tools missing", save: map[string]string{"nft/ipv4/": rulesDump(1)}, saveErr: map[string]error{"legacy": errors.New("not found")},
			variant: "nft", source: SourceRuleCount},
		{name: "nft tools broken, legacy rules", save: map[string]string{"legacy/ipv4/": rulesDump(1)}, saveErr: map[string]error{"nft": errors.New("nf_tables: incompatible")},
			variant: "legacy", source: SourceRuleCount},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fakeNode{save: tt.save, saveErr: tt.saveErr}.probes()
			if tt.noProbes {
				p = Probes{}
			}
			r := Resolve(context.Background(), auto(), p, nil)
			if r.IptablesVariant != tt.variant || r.IptablesVariantSource != tt.source {
				t.Errorf("variant = %q (%s), want %q (%s); notes %v", r.IptablesVariant, r.IptablesVariantSource, tt.variant, tt.source, r.Notes)
			}
		})
	}
}

func TestFeatures(t *testing.T) {
	r := Resolve(context.Background(), auto(), fakeNode{nftErr: errors.New("nft list tables: Operation not supported"), conntrackOK: false}.probes(), nil)
	if r.Features == nil || r.Features.NFTables || !strings.Contains(r.Features.NFTablesErr, "not supported") ||
		r.Features.ConntrackMatch || !strings.Contains(r.Features.ConntrackMatchErr, "conntrack") {
		t.Errorf("features = %+v", r.Features)
	}
	r = Resolve(context.Background(), auto(), fakeNode{conntrackOK: true}.probes(), nil)
	if r.Features == nil || !r.Features.NFTables || !r.Features.ConntrackMatch {
		t.Errorf("features = %+v", r.Features)
	}
}

func TestNFTTablesListedOnce(t *testing.T) {
	n := 0
	p := Probes{NFTTables: func(context.Context) ([]string, error) { n++; return nil, nil }}
	Resolve(context.Background(), auto(), p, nil)
	if n != 1 {
		t.Errorf("the nftables tables were listed %d times, want 1", n)
	}
}

func TestModeFromKubeProxyConfig(t *testing.T) {
	for conf, want := range map[string]string{
		"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs:\n  strictARP: true\n": "ipvs",
		"kind: KubeProxyConfiguration\n":           "iptables",
		"mode: nftables":                           "nftables",
		"kind: KubeletConfiguration\nmode: ipvs\n": "error",
		"mode: [": "error",
		"kind: KubeProxyConfiguration\nmode: kernelspace": "error",
	} {
		got, err := ModeFromKubeProxyConfig(conf)
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("ModeFromKubeProxyConfig(%q) = %q (%v), want %q", conf, got, err, want)
		}
	}
}

// The ConfigMap probe against a (fake) API: found, absent, and without config.conf.
func TestKubeProxyConfigMapProbe(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	conf, found, err := KubeProxyConfigMap(kubetest.From(client))(ctx)
	if err != nil || found || conf != "" {
		t.Fatalf("absent ConfigMap: %q %v %v", conf, found, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
		Data: map[string]string{"kubeconfig.conf": "x"}}
	if _, err := client.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, found, err = KubeProxyConfigMap(kubetest.From(client))(ctx); err != nil || found {
		t.Fatalf("ConfigMap without config.conf: found=%v err=%v", found, err)
	}
	cm.Data["config.conf"] = "kind: KubeProxyConfiguration\nmode: ipvs\n"
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := Resolve(ctx, auto(), Probes{KubeProxyConfigMap: KubeProxyConfigMap(kubetest.From(client))}, nil)
	if r.ProxyMode != "ipvs" || r.ProxyModeSource != SourceConfigMap {
		t.Errorf("Resolve with ConfigMap = %q (%s)", r.ProxyMode, r.ProxyModeSource)
	}
}

type fakeIptables struct {
	v           [3]int
	randomFully bool
}

func (f fakeIptables) GetIptablesVersion() (int, int, int) { return f.v[0], f.v[1], f.v[2] }
func (f fakeIptables) HasRandomFully() bool                { return f.randomFully }

// The selected variant's iptables version and --random-fully come from the Iptables probe.
func TestIptablesFeatures(t *testing.T) {
	cfg := auto()
	cfg.ProxyMode, cfg.IptablesVariant = "ipvs", "legacy"
	var asked []string
	p := Probes{Iptables: func(variant, family string) (IptablesTool, error) {
		asked = append(asked, variant+"/"+family)
		return fakeIptables{[3]int{1, 8, 9}, true}, nil
	}}
	f := Resolve(context.Background(), cfg, p, nil).Features
	if f == nil || f.IptablesVersion != "1.8.9" || !f.RandomFully || f.IptablesErr != "" {
		t.Errorf("Features = %+v, want version 1.8.9 with random-fully", f)
	}
	if len(asked) != 1 || asked[0] != "legacy/ipv4" {
		t.Errorf("probed %v, want the configured variant legacy/ipv4", asked)
	}
	p.Iptables = func(string, string) (IptablesTool, error) { return nil, errors.New("exec: iptables-legacy: not found") }
	if f := Resolve(context.Background(), cfg, p, nil).Features; f.IptablesVersion != "" || !strings.Contains(f.IptablesErr, "not found") {
		t.Errorf("a missing binary: %+v", f)
	}
}

// RealProbes' Iptables (go-iptables) reads the same version as `iptables-<variant> --version`.
// Only --version runs: nothing is listed or changed.
func TestIptablesProbeReadsTheBinary(t *testing.T) {
	for _, variant := range []string{"nft", "legacy"} {
		out, err := exec.Command(iptablesBinary(variant, "ipv4", ""), "--version").Output()
		if err != nil {
			t.Logf("%s: %v (not installed)", variant, err)
			continue
		}
		ipt, err := Iptables(variant, "ipv4")
		if err != nil {
			t.Fatal(err)
		}
		v1, v2, v3 := ipt.GetIptablesVersion()
		if want := fmt.Sprintf("v%d.%d.%d", v1, v2, v3); !strings.Contains(string(out), want) {
			t.Errorf("%s: go-iptables read %s, the binary says %q", variant, want, out)
		}
	}
}
