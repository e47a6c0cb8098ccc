// Package sysctl reads and writes kernel parameters of the agent's network namespace.
//
// Fixes that are not netfilter rules (e.g. conntrack-liberal) use this seam; unit tests use Fake.
package sysctl

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

// Interface reads and writes sysctls by dotted name, e.g. "net.netfilter.nf_conntrack_tcp_be_liberal".
type Interface interface {
	// Get returns the value with surrounding white space removed.
	Get(name string) (string, error)
	// Set writes value.
	Set(name, value string) error
}

// Proc is the real implementation on /proc/sys.
type Proc struct {
	// Root defaults to /proc/sys.
	Root string
}

// New returns the /proc/sys implementation.
func New() Interface { return &Proc{} }

func (p *Proc) path(name string) (string, error) {
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
func (p *Proc) Get(name string) (string, error) {
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

// Set writes the sysctl.
func (p *Proc) Set(name, value string) error {
	path, err := p.path(name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// Fake is an in-memory Interface for unit tests. Unknown names fail like a missing kernel feature.
type Fake struct {
	mu     sync.Mutex
	Values map[string]string
	Writes int
}

// NewFake returns a Fake holding values.
func NewFake(values map[string]string) *Fake {
	if values == nil {
		values = map[string]string{}
	}
	return &Fake{Values: values}
}

// Get returns the stored value.
func (f *Fake) Get(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.Values[name]
	if !ok {
		return "", fmt.Errorf("read sysctl %s: no such file or directory", name)
	}
	return v, nil
}

// Set stores value; only names that exist can be set.
func (f *Fake) Set(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Values[name]; !ok {
		return fmt.Errorf("write sysctl %s: no such file or directory", name)
	}
	f.Values[name] = value
	f.Writes++
	return nil
}
