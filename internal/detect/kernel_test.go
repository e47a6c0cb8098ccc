package detect

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// Real-kernel detection: each case builds a node's signals in a fresh network namespace (a dummy
// link named kube-ipvs0 (a veth: this kernel has no dummy driver), `table ip kube-proxy`, kubelet's hint chain in one iptables variant, a fake
// kube-proxy answering on 127.0.0.1:10249 inside the namespace) and runs RealProbes in a child
// process that lives entirely in that namespace (`ip netns exec … <this test binary>`), so every
// probe — HTTP dial, link lookup, nft and iptables-*-save — reads the namespace and never the host.

// TestHelperProcess is the child: it serves a fake /proxyMode when asked, runs detection with the real
// probes (no API client) and prints the result as JSON.
func TestHelperProcess(t *testing.T) {
	netns.Child(t, "TestRealDetection")
	if mode := os.Getenv("NNM_FAKE_KUBE_PROXY_MODE"); mode != "" {
		ln, err := net.Listen("tcp", "127.0.0.1:10249")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, mode) })
		go http.Serve(ln, mux) //nolint:errcheck // ends with the process
	}
	cfg := config.Defaults()
	r := Resolve(context.Background(), &cfg, RealProbes(nil), nil)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		os.Exit(2)
	}
	os.Exit(0)
}

func detectIn(t *testing.T, ns *netns.NS, env ...string) Result {
	t.Helper()
	out, stderr, err := ns.RunChild("TestHelperProcess", env...)
	if err != nil {
		t.Fatalf("detection in %s: %v\n%s%s", ns.Name, err, out, stderr)
	}
	var r Result
	line := strings.TrimSpace(string(out))
	if i := strings.Index(line, "{"); i >= 0 {
		line = line[i:]
	}
	if j := strings.Index(line, "\n"); j >= 0 {
		line = line[:j]
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("parse %q: %v", out, err)
	}
	return r
}

func TestRealDetection(t *testing.T) {
	netns.Require(t, "nft", "iptables-nft", "iptables-legacy")
	type want struct{ mode, modeSrc, backend, variant, variantSrc string }
	tests := []struct {
		name  string
		setup [][]string
		env   []string
		want  want
	}{
		{"empty node", nil, nil, want{ModeNone, SourceNoKubeProxy, "iptables", "nft", SourceDefault}},
		{"KUBE-SERVICES in iptables-nft", [][]string{{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"}}, nil,
			want{"iptables", SourceKubeServicesChain, "iptables", "nft", SourceDefault}},
		{"KUBE-SERVICES in ip6tables-legacy", [][]string{{"ip6tables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"}}, nil,
			want{"iptables", SourceKubeServicesChain, "iptables", "nft", SourceDefault}},
		{"kube-ipvs0 link", [][]string{{"ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kipvs-peer"}}, nil,
			want{"ipvs", SourceIPVSLink, "iptables", "nft", SourceDefault}},
		{"kube-proxy nftables table", [][]string{{"nft", "add", "table", "ip", "kube-proxy"}}, nil,
			want{"nftables", SourceNFTablesTable, "nftables", "nft", SourceDefault}},
		{"kube-proxy ip6 nftables table", [][]string{{"nft", "add", "table", "ip6", "kube-proxy"}}, nil,
			want{"nftables", SourceNFTablesTable, "nftables", "nft", SourceDefault}},
		// kube-proxy's own answer wins over a leftover kube-ipvs0 link.
		{"metrics endpoint beats link", [][]string{{"ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kipvs-peer"}},
			[]string{"NNM_FAKE_KUBE_PROXY_MODE=iptables"}, want{"iptables", SourceMetricsEndpoint, "iptables", "nft", SourceDefault}},
		{"metrics endpoint ipvs", nil, []string{"NNM_FAKE_KUBE_PROXY_MODE=ipvs"},
			want{"ipvs", SourceMetricsEndpoint, "iptables", "nft", SourceDefault}},
		{"kubelet hint in legacy, more rules in nft", [][]string{
			{"iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
			{"iptables-nft", "-A", "INPUT", "-s", "192.0.2.1", "-j", "ACCEPT"},
			{"iptables-nft", "-A", "INPUT", "-s", "192.0.2.2", "-j", "ACCEPT"},
		}, nil, want{ModeNone, SourceNoKubeProxy, "iptables", "legacy", SourceHintChain}},
		{"kubelet canary in nft, more rules in legacy", [][]string{
			{"ip6tables-nft", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
			{"iptables-legacy", "-A", "INPUT", "-s", "192.0.2.1", "-j", "ACCEPT"},
		}, nil, want{ModeNone, SourceNoKubeProxy, "iptables", "nft", SourceHintChain}},
		{"more legacy rules, no hint", [][]string{
			{"iptables-legacy", "-A", "INPUT", "-s", "192.0.2.1", "-j", "ACCEPT"},
			{"ip6tables-legacy", "-A", "INPUT", "-s", "2001:db8::1", "-j", "ACCEPT"},
			{"iptables-nft", "-A", "INPUT", "-s", "192.0.2.3", "-j", "ACCEPT"},
		}, nil, want{ModeNone, SourceNoKubeProxy, "iptables", "legacy", SourceRuleCount}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := netns.New(t, "nnm-detect")
			for _, c := range tt.setup {
				ns.MustExec(c...)
			}
			r := detectIn(t, ns, tt.env...)
			got := want{r.ProxyMode, r.ProxyModeSource, r.Backend, r.IptablesVariant, r.IptablesVariantSource}
			if got != tt.want {
				t.Errorf("detected %+v, want %+v; notes: %v", got, tt.want, r.Notes)
			}
			if r.Features == nil || !r.Features.NFTables || !r.Features.ConntrackMatch {
				t.Errorf("features = %+v, want nftables and conntrack match available", r.Features)
			}
		})
	}
}

// TestKernelNFTTablesOverNetlink: the probe lists every family's tables as nft names them, without
// running nft (PATH holds only a stand-in nft that fails), and fails naming nft when none is installed.
func TestKernelNFTTablesOverNetlink(t *testing.T) {
	netns.Require(t, "nft")
	ns := netns.New(t, "nnm-det")
	for _, tbl := range []string{"ip kube-proxy", "ip6 kube-proxy", "inet filter", "bridge br"} {
		ns.MustExec("nft", "add table "+tbl)
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "nft"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	var got []string
	if err := ns.Do(func() (err error) { got, err = NFTTables(context.Background()); return err }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"bridge br", "inet filter", "ip kube-proxy", "ip6 kube-proxy"}; !slices.Equal(got, want) {
		t.Fatalf("NFTTables = %q, want %q", got, want)
	}
	t.Setenv("PATH", t.TempDir())
	err := ns.Do(func() error { _, err := NFTTables(context.Background()); return err })
	if err == nil || !strings.Contains(err.Error(), "nft not found") {
		t.Fatalf("without nft: %v, want an error naming nft", err)
	}
}
