// Package nodestate is the SDK's seams to the node state that is not a netfilter rule: kernel
// parameters of the agent's network namespace (Sysctl) and the connection-tracking table
// (Conntrack). Node-state fixes (fix.Actuator: conntrack-liberal, stale-udp-conntrack) change the
// node only through them, so that unit tests use the fakes (NewFakeSysctl, NewFakeConntrack) and
// kernel tests the real seams inside a network namespace.
package nodestate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// ConntrackTCPBeLiberal, when 1, makes conntrack accept out-of-window TCP segments instead of marking
// them INVALID (kube-proxy's --conntrack-tcp-be-liberal). It is per network namespace. The
// conntrack-liberal fix sets it; invalid-drop reads it to tell when its drop is redundant.
const ConntrackTCPBeLiberal = "net.netfilter.nf_conntrack_tcp_be_liberal"

// Sysctl reads and writes sysctls by dotted name, e.g. "net.netfilter.nf_conntrack_tcp_be_liberal".
type Sysctl interface {
	// Get returns the value with surrounding white space removed.
	Get(name string) (string, error)
	// Set writes value.
	Set(name, value string) error
}

// ProcSysctl is the real implementation on /proc/sys.
type ProcSysctl struct {
	// Root defaults to /proc/sys.
	Root string
}

// New returns the /proc/sys implementation.
func NewSysctl() Sysctl { return &ProcSysctl{} }

func (p *ProcSysctl) path(name string) (string, error) {
	if name == "" || strings.Contains(name, "..") || strings.ContainsAny(name, "/ ") {
		return "", fmt.Errorf("invalid sysctl name %q", name)
	}
	root := p.Root
	if root == "" {
		root = "/proc/sys"
	}
	return filepath.Join(root, strings.ReplaceAll(name, ".", "/")), nil
}

// Get reads the sysctl.
func (p *ProcSysctl) Get(name string) (string, error) {
	path, err := p.path(name)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set writes the sysctl, with a newline as sysctl(8) does: an empty value is then written too (a
// write of nothing leaves a list such as ip_local_reserved_ports as it was).
func (p *ProcSysctl) Set(name, value string) error {
	path, err := p.path(name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
		return fmt.Errorf("write sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// FakeSysctl is an in-memory Sysctl for unit tests. Unknown names fail like a missing kernel feature.
type FakeSysctl struct {
	mu     sync.Mutex
	Values map[string]string
	Writes int
}

// NewFakeSysctl returns a FakeSysctl holding values.
func NewFakeSysctl(values map[string]string) *FakeSysctl {
	if values == nil {
		values = map[string]string{}
	}
	return &FakeSysctl{Values: values}
}

// Get returns the stored value.
func (f *FakeSysctl) Get(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.Values[name]
	if !ok {
		return "", fmt.Errorf("read sysctl %s: no such file or directory", name)
	}
	return v, nil
}

// Set stores value; only names that exist can be set.
func (f *FakeSysctl) Set(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Values[name]; !ok {
		return fmt.Errorf("write sysctl %s: no such file or directory", name)
	}
	f.Values[name] = value
	f.Writes++
	return nil
}
