package diagnose

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// AgentStatus is what the running agent publishes about its fixes for `diagnose` run beside it
// (`kubectl exec` into its container, or a shell on the node): which fixes run, with which options,
// and whether each one's last sync succeeded, which only the agent's engine knows. The agent writes
// it to a file of its state directory (StatusPath) when it changes and at least every Refresh;
// `diagnose` trusts it until ValidUntil, after which the agent is taken for gone.
type AgentStatus struct {
	PID        int       `json:"pid"`
	Written    time.Time `json:"written"`
	ValidUntil time.Time `json:"validUntil"`
	// ConfigFile is the configuration file the agent runs with ("" for none).
	ConfigFile string `json:"configFile,omitempty"`
	// Override is the nodeOverrides entry in effect (config.Override's text).
	Override string `json:"override,omitempty"`
	// Fixes are every registered fix with its state and last sync.
	Fixes []FixState `json:"fixes"`
	// Options are the effective options of the enabled fixes.
	Options map[string]map[string]any `json:"options,omitempty"`
}

// StatusRefresh is the longest time between two writes of the status: a reader takes a status
// older than StatusValid for that of an agent that is gone (killed, or its node lock released).
const (
	StatusRefresh = time.Minute
	StatusValid   = 3 * StatusRefresh
)

// StatusPath is the status file of the calling thread's network namespace under dir (fix.StateDir
// in production, mounted from the node): named after the namespace's inode, as the node lock is, so
// that agents of different namespaces (the tests' nodes) and a reader in the same one agree.
func StatusPath(dir string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("agent status: network namespace: %w", err)
	}
	return filepath.Join(dir, "agent-netns-"+strconv.FormatUint(st.Ino, 10)+".status.json"), nil
}

// WriteStatus writes s to path atomically (a temporary file renamed over it).
func WriteStatus(path string, s *AgentStatus) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	return nil
}

// RemoveStatus deletes the status at path (the agent stops, `cleanup`); a missing file is no error.
func RemoveStatus(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("agent status: %w", err)
	}
	return nil
}

// ReadStatus reads the status at path as of now. It returns nil and why when there is none to
// trust: no file (no agent runs in this namespace), one that does not parse, or one past its
// ValidUntil.
func ReadStatus(path string, now time.Time) (*AgentStatus, string) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "no running agent's status in " + filepath.Dir(path)
	}
	if err != nil {
		return nil, "the running agent's status cannot be read: " + err.Error()
	}
	var s AgentStatus
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Sprintf("the agent status %s does not parse: %v", path, err)
	}
	if now.After(s.ValidUntil) {
		return nil, fmt.Sprintf("the agent status %s was written %s and not renewed: no agent keeps it", path, s.Written.UTC().Format(time.RFC3339))
	}
	return &s, ""
}

// Describe is the report's account of where the fixes' states come from.
func (s *AgentStatus) Describe() string {
	return fmt.Sprintf("from the running agent (pid %d, status written %s)", s.PID, s.Written.UTC().Format(time.RFC3339))
}

// Use makes the fixes' states, options and override of env the running agent's.
func (s *AgentStatus) Use(env *Env) {
	env.Fixes, env.Override, env.Agent = s.Fixes, s.Override, s.Describe()
	env.Options = map[string]map[string]any{}
	for id, o := range s.Options {
		env.Options[id] = o
	}
}

// DefaultStatusDir is where the agent keeps its status (its state directory on the node).
const DefaultStatusDir = fix.StateDir
