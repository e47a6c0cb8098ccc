package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinary builds the custom agent and runs `version` and `plan` as a user would: the example fix
// is registered next to the standard ones, its configuration is accepted, and both backends render
// its rules for the example Services (../services.yaml gives the node its pod CIDRs).
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "custom-agent")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := func(bin string, args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "NNM_METRICS_ADDRESS=") // no server; nothing else is started
		out, err := cmd.Output()
		return string(out), err
	}
	out, err := run(bin, "version")
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	for _, id := range []string{"metadata-block", "invalid-drop", "ipvs-externalip-dnat", "conntrack-liberal"} {
		if !strings.Contains(out, "\n  "+id+" ") {
			t.Errorf("version does not list fix %s:\n%s", id, out)
		}
	}
	out, err = run(bin, "plan", "--services", "../services.yaml", "--config", "config.yaml")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, want := range []string{
		"# fix metadata-block: enabled",
		"# ---- backend iptables, fix metadata-block, family ipv4: 1 rules",
		"-A NNM-METADATA-BLOCK -s 10.244.1.0/24 -d 169.254.169.254/32",
		"# ---- backend nftables, fix metadata-block, family ipv6: 1 rules",
		"table ip6 nnm-metadata-block",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	// The out-of-tree input is registered: `plan` reads Namespaces from a file only when an input
	// of the agent watches them.
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	services, err := os.ReadFile("../services.yaml")
	if err != nil {
		t.Fatal(err)
	}
	namespace := "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: tenant-a\n  labels: {exempt: \"true\"}\n"
	if err := os.WriteFile(objects, append(services, namespace...), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(bin, "plan", "--services", objects, "--config", "config.yaml"); err != nil {
		t.Fatalf("plan with a Namespace: %v\n%s", err, out)
	}
	// The stock agent (make test sets NNM_AGENT_BIN) knows neither the fix nor the input, and says so.
	if stock := os.Getenv("NNM_AGENT_BIN"); stock != "" {
		cmd := exec.Command(stock, "plan", "--services", "../services.yaml", "--config", "config.yaml")
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "metadata-block") {
			t.Errorf("the stock agent accepted fixes.metadata-block: %v\n%s", err, out)
		}
		cmd = exec.Command(stock, "plan", "--services", objects)
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "Namespace") {
			t.Errorf("the stock agent read a Namespace: %v\n%s", err, out)
		}
	}
}
