package detect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	goiptables "github.com/coreos/go-iptables/iptables"
	gnft "github.com/google/nftables"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/toolslot"
)

// ProxyModeURL is where kube-proxy answers with its mode (its metrics server, host network).
const ProxyModeURL = "http://127.0.0.1:10249/proxyMode"

// ProbeTimeout bounds each probe.
const ProbeTimeout = time.Second

var yamlUnmarshal = yaml.Unmarshal

// RealProbes reads the node. client may be nil: then the kube-proxy ConfigMap is not consulted
// (`plan` runs without an API client). Nothing is written anywhere.
func RealProbes(client kube.Interface) Probes {
	p := Probes{
		ProxyModeEndpoint: HTTPProxyMode(ProxyModeURL),
		LinkExists:        LinkExists,
		NFTTables:         NFTTables,
		IptablesSave:      IptablesSave,
		ConntrackMatch:    ConntrackMatch,
		Iptables:          Iptables,
	}
	if client != nil {
		p.KubeProxyConfigMap = KubeProxyConfigMap(client)
	}
	return p
}

// HTTPProxyMode GETs url (kube-proxy's /proxyMode) with a short timeout.
func HTTPProxyMode(url string) func(context.Context) (string, error) { return HTTPGet(url, 256) }

// HTTPGet GETs url (kube-proxy's metrics server on the node's loopback) with a short timeout and
// returns at most limit bytes of the body.
func HTTPGet(url string, limit int64) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return "", err
		}
		// A proxy from the environment must not answer for the node's loopback.
		c := &http.Client{Transport: &http.Transport{Proxy: nil}}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return string(body), nil
	}
}

// LinkExists reports whether the network interface exists in the current network namespace.
func LinkExists(name string) (bool, error) {
	_, err := net.InterfaceByName(name)
	if err == nil {
		return true, nil
	}
	if strings.Contains(err.Error(), "no such network interface") {
		return false, nil
	}
	return false, err
}

// NFTTables lists the nf_tables tables of every family as "family name" pairs, over netlink (a table
// dump with github.com/google/nftables, in the calling thread's network namespace). `nft list tables`
// is not used: nft fetches the whole ruleset for it, rules included, which beside 30,000 iptables-nft
// rules cost 6 s of CPU (BENCHMARKS.md, 30,000 Services). It fails, naming the cause, when nft is not
// installed (the nftables backend needs it for its transactions), the kernel has no nf_tables or the
// caller lacks CAP_NET_ADMIN.
func NFTTables(context.Context) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("nft not found (install nftables): %w", err)
	}
	conn, err := gnft.New()
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		return nil, fmt.Errorf("list nftables tables over netlink (kernel without nf_tables, or no CAP_NET_ADMIN?): %w", err)
	}
	out := make([]string, 0, len(tables))
	for _, t := range tables {
		out = append(out, nftFamilyName(t.Family)+" "+t.Name)
	}
	return out, nil
}

// nftFamilyName is a table family as nft writes it.
func nftFamilyName(f gnft.TableFamily) string {
	if name, ok := nftFamilyNames[f]; ok {
		return name
	}
	return fmt.Sprintf("family-%d", f)
}

var nftFamilyNames = map[gnft.TableFamily]string{
	gnft.TableFamilyIPv4: "ip", gnft.TableFamilyIPv6: "ip6", gnft.TableFamilyINet: "inet",
	gnft.TableFamilyARP: "arp", gnft.TableFamilyBridge: "bridge", gnft.TableFamilyNetdev: "netdev",
}

// IptablesSave runs iptables-<variant>-save (ip6tables-… for ipv6), for one table or all.
//
// The legacy variant creates a table it is asked for by name (`iptables-legacy-save -t mangle` in a
// fresh network namespace leaves an empty mangle table, and iptables-nft then warns "iptables-legacy
// tables present"), so a table the kernel does not list in /proc/net/ip{,6}_tables_names is reported
// empty without running the tool: detection, and `plan`, read the node and create nothing.
func IptablesSave(ctx context.Context, variant, family, table string) (string, error) {
	return iptablesSave(ctx, variant, family, table)
}

// IptablesSaveCounters is IptablesSave with every rule's packet and byte counters (-c).
func IptablesSaveCounters(ctx context.Context, variant, family, table string) (string, error) {
	return iptablesSave(ctx, variant, family, table, "-c")
}

func iptablesSave(ctx context.Context, variant, family, table string, extra ...string) (string, error) {
	args := extra
	if table != "" {
		if variant == "legacy" && !legacyTableExists(family, table) {
			return "", nil
		}
		args = append([]string{"-t", table}, extra...)
	}
	bin := iptablesBinary(variant, family, "save")
	release, err := toolslot.Acquire(ctx, bin)
	if err != nil {
		return "", err
	}
	defer release()
	return run(ctx, bin, args...)
}

// LegacyTablesFile lists the legacy tables of the current network namespace; the file is absent
// while the ip_tables module (ip6_tables for ipv6) is not loaded, i.e. there are none.
func LegacyTablesFile(family string) string {
	if family == "ipv6" {
		return "/proc/net/ip6_tables_names"
	}
	return "/proc/net/ip_tables_names"
}

func legacyTableExists(family, table string) bool {
	b, err := os.ReadFile(LegacyTablesFile(family))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Fields(string(b)), table)
}

func iptablesBinary(variant, family, tool string) string {
	base := "iptables"
	if family == "ipv6" {
		base = "ip6tables"
	}
	if tool == "" {
		return base + "-" + variant
	}
	return base + "-" + variant + "-" + tool
}

// Iptables opens iptables-<variant> (ip6tables-… for ipv6) with go-iptables, which runs its
// --version once and derives the features from it; nothing is listed or changed.
func Iptables(variant, family string) (IptablesTool, error) {
	proto := goiptables.ProtocolIPv4
	if family == "ipv6" {
		proto = goiptables.ProtocolIPv6
	}
	ipt, err := goiptables.New(goiptables.IPFamily(proto), goiptables.Path(iptablesBinary(variant, family, "")), goiptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", iptablesBinary(variant, family, ""), err)
	}
	return ipt, nil
}

// ConntrackMatch checks that iptables-<variant> has the conntrack match extension. It only loads
// the extension's help (no rule is touched); a missing kernel module shows up when the rule is
// applied, and the backend's error then names the match.
func ConntrackMatch(ctx context.Context, variant string) error {
	out, err := run(ctx, iptablesBinary(variant, "ipv4", ""), "-m", "conntrack", "--help")
	if err != nil {
		return fmt.Errorf("conntrack match: %w", err)
	}
	if !strings.Contains(out, "--ctstate") {
		return errors.New("conntrack match: the iptables binary does not know --ctstate")
	}
	return nil
}

// KubeProxyConfigMap reads data["config.conf"] of kube-system/kube-proxy (kubeadm's layout).
func KubeProxyConfigMap(client kube.Interface) func(context.Context) (string, bool, error) {
	return func(ctx context.Context) (string, bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*ProbeTimeout)
		defer cancel()
		cm, err := client.GetConfigMap(ctx, "kube-system", "kube-proxy")
		switch {
		case apierrors.IsNotFound(err):
			return "", false, nil
		case apierrors.IsForbidden(err):
			return "", false, fmt.Errorf("%w (grant get on configmaps/kube-proxy in kube-system: deploy/base/kube-proxy-config-rbac.yaml)", err)
		case err != nil:
			return "", false, err
		}
		conf, ok := cm.Data["config.conf"]
		return conf, ok, nil
	}
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*ProbeTimeout)
	defer cancel()
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
