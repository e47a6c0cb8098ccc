// Command demo is `make demo`: it starts a local control plane (etcd + kube-apiserver), a "node"
// network namespace and the agent in it with the ServiceAccount and RBAC of deploy/base, creates the
// Node and Services of examples/services.yaml (writing LoadBalancer ingress IPs through the status
// subresource, as a cloud controller would), and shows what the agent programmed. It runs until
// interrupted (DEMO_ONCE=1: prints and exits) and then removes everything it created.
//
// Environment: DEMO_BACKEND=iptables|nftables (default iptables), DEMO_ONCE=1, DEMO_NETNS (default
// nnm-demo), NNM_AGENT_BIN (default bin/network-node-manager), NNM_BIN_DIR (etcd, kube-apiserver).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

const metricsPort = 9484

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run() (err error) {
	backend := env("DEMO_BACKEND", "iptables")
	if backend != "iptables" && backend != "nftables" {
		return fmt.Errorf("DEMO_BACKEND=%q: want iptables or nftables", backend)
	}
	once := os.Getenv("DEMO_ONCE") != "" && os.Getenv("DEMO_ONCE") != "0"
	nodeNS := env("DEMO_NETNS", "nnm-demo")
	if err := controlplane.CheckPrerequisites(""); err != nil {
		return err
	}
	if err := agenttest.CheckPrerequisites(); err != nil {
		return err
	}
	root, err := agenttest.RepoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()

	// Everything created is undone in reverse order, also on error or ^C.
	var undo []func()
	defer func() {
		if len(undo) > 0 {
			step("cleaning up")
		}
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}()

	step("starting etcd and kube-apiserver in their own network namespace")
	start := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return err
	}
	undo = append(undo, func() {
		if err := cp.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "demo: close control plane:", err)
		}
	})
	fmt.Printf("    %s in netns %s, up in %v (admin kubeconfig %s)\n", cp.Server(), cp.Netns(), time.Since(start).Round(time.Millisecond), cp.AdminKubeconfig())
	admin := cp.AdminClient()

	step("creating the node network namespace %s", nodeNS)
	if err := createNetns(nodeNS); err != nil {
		return err
	}
	undo = append(undo, func() {
		if err := netns.Delete(context.Background(), nodeNS); err != nil {
			fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		}
	})

	step("applying the agent's ServiceAccount and RBAC from deploy/base")
	files, err := agenttest.DeployBaseFiles()
	if err != nil {
		return err
	}
	if err := agenttest.ApplyManifests(ctx, cp.AdminRESTConfig(), files, nil); err != nil {
		return err
	}
	kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "kube-system", "network-node-manager", nodeNS)
	if err != nil {
		return err
	}

	step("creating the Node and Services of examples/services.yaml")
	nodeName, err := createExamples(ctx, admin, filepath.Join(root, "examples", "services.yaml"))
	if err != nil {
		return err
	}

	logDir, err := os.MkdirTemp("", "nnm-demo-")
	if err != nil {
		return err
	}
	undo = append(undo, func() { _ = os.RemoveAll(logDir) })
	step("starting the agent in %s (backend %s, kube-proxy mode ipvs, both fixes)", nodeNS, backend)
	agent, err := agenttest.Start(agenttest.Options{
		Netns:   nodeNS,
		LogFile: filepath.Join(logDir, "agent.log"),
		Args: []string{
			"--config", filepath.Join(root, "examples", "config.yaml"),
			"--kubeconfig", kubeconfig,
			"--node-name", nodeName,
			"--backend", backend,
			"--proxy-mode", "ipvs",
			"--enable-fix", "invalid-drop,ipvs-externalip-dnat",
			"--metrics-address", fmt.Sprintf("127.0.0.1:%d", metricsPort),
			"--min-sync-period", "200ms",
		},
	})
	if err != nil {
		return err
	}
	undo = append(undo, func() {
		if err := agent.Stop(15 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "demo: stop agent:", err)
		}
	})
	if err := agent.WaitReady(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("%w\nagent log:\n%s", err, agent.LogTail(40))
	}
	// Ready means one full pass; wait until the covered count settles so late events are in.
	settle(ctx, agent)

	if err := show(ctx, agent, backend, nodeNS); err != nil {
		return fmt.Errorf("%w\nagent log:\n%s", err, agent.LogTail(40))
	}
	fmt.Print(pokeHelp(backend, nodeNS, agent.LogPath(), cp.AdminKubeconfig(), once))
	if once {
		step("DEMO_ONCE is set: done")
		return nil
	}
	step("running; press Ctrl-C to stop and clean up")
	select {
	case <-ctx.Done():
		fmt.Println()
		return nil
	case <-waitExit(agent):
		return fmt.Errorf("the agent exited: %v\n%s", agent.Exited(), agent.LogTail(40))
	}
}

func waitExit(a *agenttest.Agent) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for a.Exited() == nil {
			time.Sleep(500 * time.Millisecond)
		}
		close(ch)
	}()
	return ch
}

// createNetns creates the node namespace; a leftover of an earlier demo with nothing running in it is
// removed first.
func createNetns(name string) error {
	ctx := context.Background()
	if netns.Exists(name) {
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		if strings.TrimSpace(string(out)) != "" {
			return fmt.Errorf("network namespace %s exists and processes run in it (another demo?); set DEMO_NETNS", name)
		}
		if err := netns.Delete(ctx, name); err != nil {
			return fmt.Errorf("remove leftover netns: %w", err)
		}
	}
	return netns.Create(ctx, name)
}

// createExamples creates the Nodes and Services of the file; a Service's status is written afterwards
// through the status subresource. It returns the name of the (first) Node, the agent's node.
func createExamples(ctx context.Context, cs kubernetes.Interface, path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	nodeName := "node-1"
	foundNode := false
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return "", fmt.Errorf("%s document %d: %w", path, i, err)
		}
		switch tm.Kind {
		case "":
			continue
		case "Node":
			var n corev1.Node
			if err := yaml.UnmarshalStrict([]byte(doc), &n); err != nil {
				return "", fmt.Errorf("%s document %d: %w", path, i, err)
			}
			if _, err := cs.CoreV1().Nodes().Create(ctx, &n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return "", fmt.Errorf("create node %s: %w", n.Name, err)
			}
			if !foundNode {
				nodeName, foundNode = n.Name, true
			}
			fmt.Printf("    node %-28s podCIDRs %v\n", n.Name, n.Spec.PodCIDRs)
		case "Service":
			var svc corev1.Service
			if err := yaml.UnmarshalStrict([]byte(doc), &svc); err != nil {
				return "", fmt.Errorf("%s document %d: %w", path, i, err)
			}
			if svc.Namespace == "" {
				svc.Namespace = "default"
			}
			if err := agenttest.EnsureNamespace(ctx, cs, svc.Namespace); err != nil {
				return "", err
			}
			status := svc.Status
			svc.Status = corev1.ServiceStatus{}
			got, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, &svc, metav1.CreateOptions{})
			if err != nil {
				return "", fmt.Errorf("create service %s/%s: %w", svc.Namespace, svc.Name, err)
			}
			if len(status.LoadBalancer.Ingress) > 0 {
				got.Status.LoadBalancer = status.LoadBalancer
				if got, err = cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
					return "", fmt.Errorf("set load-balancer status of %s/%s: %w", svc.Namespace, svc.Name, err)
				}
			}
			fmt.Printf("    service %-25s %-12s clusterIPs %v externalIPs %v ingress %s\n",
				svc.Namespace+"/"+svc.Name, got.Spec.Type, got.Spec.ClusterIPs, got.Spec.ExternalIPs, ingressString(got.Status.LoadBalancer.Ingress))
		default:
			return "", fmt.Errorf("%s document %d: kind %q is not Node or Service", path, i, tm.Kind)
		}
	}
	return nodeName, nil
}

func ingressString(in []corev1.LoadBalancerIngress) string {
	var parts []string
	for _, i := range in {
		s := i.IP
		if i.IPMode != nil && *i.IPMode != corev1.LoadBalancerIPModeVIP {
			s += " (ipMode " + string(*i.IPMode) + ")"
		}
		parts = append(parts, s)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// settle waits (at most 10 s) until the covered and skipped counts stop changing for a second.
func settle(ctx context.Context, a *agenttest.Agent) {
	last, since := "", time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := a.Metrics(ctx)
		if err == nil {
			cur := strings.Join(m.Lines("nnm_fix_objects_", "nnm_rules_programmed"), "\n")
			if cur != last {
				last, since = cur, time.Now()
			} else if time.Since(since) > time.Second {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// show prints the rules of ours in the node's kernel and a few metric lines.
func show(ctx context.Context, a *agenttest.Agent, backend, nodeNS string) error {
	if backend == "nftables" {
		step("the agent's nftables tables in %s (nft list table …)", nodeNS)
		out, err := netns.Exec(ctx, nodeNS, "nft", "list", "tables")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line) // "table ip nnm-invalid-drop"
			if len(f) != 3 || !strings.HasPrefix(f[2], "nnm-") {
				continue
			}
			t, err := netns.Exec(ctx, nodeNS, "nft", "list", "table", f[1], f[2])
			if err != nil {
				return err
			}
			fmt.Print(t)
		}
	} else {
		for _, fam := range []string{"ipv4", "ipv6"} {
			for _, table := range []string{"filter", "nat"} {
				out, err := agenttest.IptablesSave(ctx, nodeNS, "", fam, table)
				if err != nil {
					return err
				}
				lines := agenttest.Lines(out, "NNM-")
				if len(lines) == 0 {
					continue
				}
				step("%s-save -t %s in %s (our chains and jumps)", map[string]string{"ipv4": "iptables", "ipv6": "ip6tables"}[fam], table, nodeNS)
				fmt.Println("    " + strings.Join(lines, "\n    "))
			}
		}
	}
	m, err := a.Metrics(ctx)
	if err != nil {
		return err
	}
	step("metrics (curl 127.0.0.1:%d/metrics inside %s), a few lines", metricsPort, nodeNS)
	lines := m.Lines("nnm_fix_enabled", "nnm_rules_programmed", "nnm_fix_objects_covered", "nnm_fix_objects_skipped",
		"nnm_ipvs_externalip_dnat_", "nnm_sync_errors_total", "nnm_agent_info")
	if len(lines) == 0 {
		return errors.New("the agent exports no nnm_ metrics")
	}
	fmt.Println("    " + strings.Join(lines, "\n    "))
	for _, p := range []string{"/healthz", "/readyz"} {
		code, body, err := a.Get(ctx, p)
		if err != nil {
			return err
		}
		fmt.Printf("    %s: %d %s\n", p, code, strings.TrimSpace(body))
	}
	return nil
}

// pokeHelp says how to look at the demo from a shell.
func pokeHelp(backend, ns, logPath, kubeconfig string, once bool) string {
	fetch := "curl -s"
	if _, err := exec.LookPath("curl"); err != nil {
		fetch = "wget -qO-"
	}
	lines := []string{"", "==> poke at it (as root, while the demo runs):"}
	if backend == "nftables" {
		lines = append(lines,
			fmt.Sprintf("    ip netns exec %s nft list ruleset", ns),
			fmt.Sprintf("    ip netns exec %s nft flush map ip nnm-ipvs-externalip-dnat svc   # break it: restored within syncPeriod (30s)", ns))
	} else {
		lines = append(lines,
			fmt.Sprintf("    ip netns exec %s iptables-save | grep -e NNM- -e network-node-manager", ns),
			fmt.Sprintf("    ip netns exec %s iptables -t nat -F NNM-EXTIP-DNAT   # break it: restored within syncPeriod (30s)", ns))
	}
	lines = append(lines,
		fmt.Sprintf("    ip netns exec %s %s http://127.0.0.1:%d/metrics | grep ^nnm_", ns, fetch, metricsPort),
		fmt.Sprintf("    ip netns exec %s %s http://127.0.0.1:%d/healthz", ns, fetch, metricsPort),
		fmt.Sprintf("    tail -f %s   # the agent's log", logPath),
		fmt.Sprintf("    KUBECONFIG=%s kubectl get svc -A   # the API server, if you have kubectl", kubeconfig))
	if once {
		lines = append(lines, "    (DEMO_ONCE=1: everything is removed now; run `make demo` to keep it running)")
	}
	return strings.Join(lines, "\n") + "\n"
}
