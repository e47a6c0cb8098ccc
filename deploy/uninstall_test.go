package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/nodestate"
	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/fixes/conntrackliberal"
	"github.com/network-node-manager/network-node-manager/internal/nodelock"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// The uninstall path restores what conntrack-liberal changed: the agent (the real binary, in a node
// network namespace, no API server: the fix reads nothing from it) sets
// nf_conntrack_tcp_be_liberal to 1 and records the value it found; after the agent stops, the value
// stays (a restart must not flip it); `network-node-manager cleanup`, which the uninstall pods run
// (TestUninstallRevertsNodeState checks they see the same state directory and /proc/sys/net), writes
// the recorded value back and forgets it, and removes the rules.
func TestUninstallRestoresConntrackLiberal(t *testing.T) {
	netns.RequireKernel(t, "nft")
	agenttest.Require(t)
	ns := netns.New(t, "nnm-uninst")
	proc := "/proc/sys/" + strings.ReplaceAll(nodestate.ConntrackTCPBeLiberal, ".", "/")
	read := func() string {
		t.Helper()
		out, err := ns.Exec("cat", proc)
		if err != nil {
			netns.Unavailable(t, "the namespace has no %s (nf_conntrack not loaded): %v", nodestate.ConntrackTCPBeLiberal, err)
		}
		return strings.TrimSpace(out)
	}
	before := read()
	if before == conntrackliberal.Liberal {
		t.Fatalf("a new namespace starts with %s=%s; the test needs another value", nodestate.ConntrackTCPBeLiberal, before)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(`fixes:
  conntrack-liberal:
    enabled: true
    stateDir: `+state+`
  invalid-drop:
    enabled: true
  ipvs-externalip-dnat:
    enabled: false
`), 0o644); err != nil {
		t.Fatal(err)
	}
	common := []string{"--config", cfg, "--proc-sys-path", "/proc/sys", "--backend", "nftables", "--proxy-mode", "ipvs"}
	cleanupArgs := common[:4] // cleanup refuses the flags it does not read (--backend, --proxy-mode)
	a := agenttest.StartT(t, agenttest.Options{Netns: ns.Name, Args: append([]string{"--node-name", "uninstall"}, common...)})
	a.WaitReadyT(t, 30*time.Second)
	if v := read(); v != conntrackliberal.Liberal {
		t.Fatalf("the agent is ready but %s = %s", nodestate.ConntrackTCPBeLiberal, v)
	}
	// The node lock of the namespace (internal/nodelock), which the uninstall removes.
	ino := strings.TrimSpace(ns.MustExec("stat", "-L", "-c", "%i", "/proc/self/ns/net"))
	lock := filepath.Join(nodelock.Dir, "agent-netns-"+ino+".lock")
	if _, err := os.Stat(lock); err != nil {
		t.Fatalf("the agent runs but its node lock file is not %s: %v", lock, err)
	}
	if _, err := os.Stat(filepath.Join(state, conntrackliberal.StateFile)); err != nil {
		t.Fatalf("the value to restore is not recorded: %v", err)
	}
	if err := a.Stop(agenttest.StopGrace); err != nil {
		t.Fatal(err)
	}
	if v := read(); v != conntrackliberal.Liberal {
		t.Fatalf("stopping the agent changed %s to %s; it must stay until uninstall", nodestate.ConntrackTCPBeLiberal, v)
	}

	bin, err := agenttest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	// cleanup --dry-run names what it would remove and revert, and changes nothing.
	out, err := ns.Exec(append([]string{bin, "cleanup", "--dry-run"}, cleanupArgs...)...)
	if err != nil {
		t.Fatalf("cleanup --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"would remove nftables: table ip nnm-invalid-drop", "would remove nftables: table ip6 nnm-invalid-drop",
		"would revert the node state of fix conntrack-liberal", "would remove the node lock file " + lock, "nothing was changed"} {
		if !strings.Contains(out, want) {
			t.Errorf("cleanup --dry-run output lacks %q:\n%s", want, out)
		}
	}
	if v := read(); v != conntrackliberal.Liberal {
		t.Errorf("cleanup --dry-run changed %s to %s", nodestate.ConntrackTCPBeLiberal, v)
	}
	if tables := ns.MustExec("nft", "list", "tables"); !strings.Contains(tables, "nnm-invalid-drop") {
		t.Errorf("cleanup --dry-run removed tables:\n%s", tables)
	}

	out, err = ns.Exec(append([]string{bin, "cleanup"}, cleanupArgs...)...)
	if err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if v := read(); v != before {
		t.Errorf("after cleanup %s = %s, want the value before the agent, %s\n%s", nodestate.ConntrackTCPBeLiberal, v, before, out)
	}
	if _, err := os.Stat(filepath.Join(state, conntrackliberal.StateFile)); !os.IsNotExist(err) {
		t.Errorf("cleanup left the state file (%v)", err)
	}
	if tables := ns.MustExec("nft", "list", "tables"); strings.Contains(tables, "nnm") {
		t.Errorf("cleanup left nftables tables:\n%s", tables)
	}
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Errorf("cleanup left the node lock file %s (%v)", lock, err)
	}
}
