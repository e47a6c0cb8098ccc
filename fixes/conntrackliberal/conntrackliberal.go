package conntrackliberal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/nodestate"
)

// Liberal is the value the fix keeps in nodestate.ConntrackTCPBeLiberal. The sysctl is per network
// namespace: the agent runs in the node's (hostNetwork), so it changes the node's.
const Liberal = "1"

// StateFile is the name of the state file under Config.StateDir.
const StateFile = ID + ".json"

// record is what the fix remembers about the value it replaced.
type record struct {
	Sysctl   string `json:"sysctl"`
	Previous string `json:"previous"`
}

// Fix is the conntrack-liberal fix.
type Fix struct {
	fix.Base[Config, Config]
	sys nodestate.Sysctl

	mu       sync.Mutex
	rec      *record // the value to restore; nil when nothing is owed
	savedIn  string  // the directory rec was last written to
	ensured  bool    // a successful Ensure since the last Revert: non-full passes need no check
	restored int     // Revert calls that wrote the sysctl (tests)
}

var (
	_ fix.Actuator = (*Fix)(nil)
)

// New builds the fix with its default configuration and registers its metrics. No I/O.
func New(p fix.Params) (*Fix, error) {
	if p.Sysctl == nil {
		return nil, errors.New(ID + ": no nodestate.Sysctl")
	}
	f := &Fix{sys: p.Sysctl}
	if err := f.Init(spec, p, newMetrics(f)); err != nil {
		return nil, err
	}
	return f, nil
}

func parse(cfg Config) (Config, error) {
	if cfg.StateDir != "" && !filepath.IsAbs(cfg.StateDir) {
		return cfg, fix.Invalid("stateDir", "%q is not an absolute path", cfg.StateDir)
	}
	return cfg, nil
}

// Ensure sets the sysctl to 1. The first time it remembers the value it found (in the state file
// before writing anything, so that a crash in between loses nothing). On a full pass it re-reads the
// sysctl and sets it again if someone reset it (a repair).
func (f *Fix) Ensure(_ context.Context, _ *fix.Snapshot, full bool) (fix.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := fix.Result{Report: fix.Report{Covered: 1}}
	if f.ensured && !full {
		return res, nil
	}
	cur, err := f.sys.Get(nodestate.ConntrackTCPBeLiberal)
	if err != nil {
		return res, fmt.Errorf("%w (is the nf_conntrack module loaded?)", err)
	}
	rec, err := f.loadLocked()
	if err != nil {
		return res, err
	}
	owed := rec != nil
	if rec == nil {
		rec = &record{Sysctl: nodestate.ConntrackTCPBeLiberal, Previous: cur}
	}
	if err := f.saveLocked(rec); err != nil {
		return res, err
	}
	if cur != Liberal {
		if err := f.sys.Set(nodestate.ConntrackTCPBeLiberal, Liberal); err != nil {
			return res, err
		}
		if v, err := f.sys.Get(nodestate.ConntrackTCPBeLiberal); err != nil || v != Liberal {
			return res, fmt.Errorf("sysctl %s is %q after writing %s (err: %v)", nodestate.ConntrackTCPBeLiberal, v, Liberal, err)
		}
		if owed {
			res.Repaired = true // it was ours and someone reset it
		} else {
			res.Changed = true
			f.Log.Info("conntrack accepts out-of-window TCP segments now", "sysctl", nodestate.ConntrackTCPBeLiberal, "value", Liberal, "previous", cur)
		}
	}
	f.ensured = true
	return res, nil
}

// Revert puts the remembered value back, but only while the sysctl still holds the fix's 1: a value
// someone else set since is theirs and stays. It then forgets the record. Nothing owed: no-op.
func (f *Fix) Revert(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ensured = false
	rec, err := f.loadLocked()
	if err != nil || rec == nil {
		return err
	}
	cur, err := f.sys.Get(nodestate.ConntrackTCPBeLiberal)
	if err != nil {
		return err
	}
	switch {
	case cur == rec.Previous:
	case cur == Liberal:
		if err := f.sys.Set(nodestate.ConntrackTCPBeLiberal, rec.Previous); err != nil {
			return err
		}
		f.restored++
		f.Log.Info("restored the previous value", "sysctl", nodestate.ConntrackTCPBeLiberal, "value", rec.Previous)
	default:
		f.Log.Warn("someone else changed the sysctl since; leaving their value", "sysctl", nodestate.ConntrackTCPBeLiberal, "value", cur, "previous", rec.Previous)
	}
	if f.savedIn != "" {
		if err := os.Remove(filepath.Join(f.savedIn, StateFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("forget the previous value: %w", err)
		}
	}
	f.rec, f.savedIn = nil, ""
	return nil
}

// loadLocked returns the record held in memory, else the one in the state file, else nil.
func (f *Fix) loadLocked() (*record, error) {
	dir := f.Config().StateDir
	if f.rec != nil || dir == "" {
		return f.rec, nil
	}
	path := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil || rec.Sysctl != nodestate.ConntrackTCPBeLiberal || rec.Previous == "" {
		return nil, fmt.Errorf("state file %s is not ours or is damaged (%v): delete it after checking %s", path, err, nodestate.ConntrackTCPBeLiberal)
	}
	f.rec, f.savedIn = &rec, dir
	return f.rec, nil
}

// saveLocked makes rec the record in memory and, unless it is there already, in the state directory
// (written to a temporary file and renamed, so a crash never leaves half a file).
func (f *Fix) saveLocked(rec *record) error {
	f.rec = rec
	dir := f.Config().StateDir
	if dir == "" || f.savedIn == dir {
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	tmp := filepath.Join(dir, "."+StateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, StateFile)); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	f.savedIn = dir
	return nil
}

// previous returns the value Revert would restore, if any is owed.
func (f *Fix) previous() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rec == nil {
		return "", false
	}
	return f.rec.Previous, true
}
