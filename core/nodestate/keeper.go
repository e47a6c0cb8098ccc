package nodestate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// Keeper writes the sysctls a node-state fix wants and remembers, per sysctl, the value it found
// before its first write and the value it wrote, in a state file written before the sysctl (so a
// crash in between loses nothing, and the record survives restarts). Revert puts a found value back
// only where the sysctl still holds the value the Keeper wrote: a value someone else set since is
// theirs and stays. Whether a wanted value may replace the current one (never lowering what an
// operator or another agent set higher) is the fix's decision, made before Set.
type Keeper struct {
	sys  Sysctl
	path string // "" keeps the record in memory only

	mu     sync.Mutex
	rec    map[string]Kept
	loaded bool
}

// Kept is what the Keeper remembers of one sysctl.
type Kept struct {
	Previous string `json:"previous"`
	Ours     string `json:"ours"`
}

// NewKeeper returns a Keeper of sys recording in the file path ("" for memory only). No I/O.
func NewKeeper(sys Sysctl, path string) *Keeper {
	return &Keeper{sys: sys, path: path}
}

// Set writes each sysctl of want (name → value) that does not hold its value, remembering the value
// it found the first time, and reads each one back. It returns the names it wrote, sorted.
func (k *Keeper) Set(want map[string]string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.loadLocked(); err != nil {
		return nil, err
	}
	var wrote []string
	for _, name := range sortedKeys(want) {
		v := want[name]
		cur, err := k.sys.Get(name)
		if err != nil {
			return wrote, err
		}
		if cur == v {
			continue
		}
		kept, known := k.rec[name]
		if !known {
			kept.Previous = cur
		}
		kept.Ours = v
		k.rec[name] = kept
		if err := k.saveLocked(); err != nil {
			return wrote, err
		}
		if err := k.sys.Set(name, v); err != nil {
			return wrote, err
		}
		if got, err := k.sys.Get(name); err != nil || got != v {
			return wrote, fmt.Errorf("sysctl %s is %q after writing %s (err: %v)", name, got, v, err)
		}
		wrote = append(wrote, name)
	}
	return wrote, nil
}

// Revert restores the found value of every sysctl the Keeper wrote that still holds its value, and
// forgets them all. It returns the names it restored and those left alone (changed by someone else
// since), sorted.
func (k *Keeper) Revert() (restored, left []string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.loadLocked(); err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, name := range sortedKeys(k.rec) {
		kept := k.rec[name]
		cur, err := k.sys.Get(name)
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case cur != kept.Ours:
			left = append(left, name)
		default:
			if err := k.sys.Set(name, kept.Previous); err != nil {
				errs = append(errs, err)
				continue
			}
			restored = append(restored, name)
		}
		delete(k.rec, name)
	}
	if err := errors.Join(errs...); err != nil {
		_ = k.saveLocked()
		return restored, left, err
	}
	if k.path != "" {
		if err := os.Remove(k.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return restored, left, fmt.Errorf("forget the previous values: %w", err)
		}
	}
	return restored, left, nil
}

// Kept returns what the Keeper remembers (name → Kept); empty when nothing is owed.
func (k *Keeper) Kept() map[string]Kept {
	k.mu.Lock()
	defer k.mu.Unlock()
	_ = k.loadLocked()
	out := make(map[string]Kept, len(k.rec))
	for n, v := range k.rec {
		out[n] = v
	}
	return out
}

func (k *Keeper) loadLocked() error {
	if k.loaded {
		return nil
	}
	k.rec = map[string]Kept{}
	if k.path != "" {
		b, err := os.ReadFile(k.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("read state: %w", err)
		default:
			if err := json.Unmarshal(b, &k.rec); err != nil {
				return fmt.Errorf("state file %s is damaged (%v): delete it after checking the sysctls it names", k.path, err)
			}
		}
	}
	k.loaded = true
	return nil
}

// saveLocked writes the record to a temporary file and renames it over the state file.
func (k *Keeper) saveLocked() error {
	if k.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(k.rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(k.path), 0o755); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	tmp := k.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp, k.path); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
