package nodestate

import (
	"log/slog"
	"path/filepath"
)

// Keepers hands a node-state fix the Keeper of its configured state directory (the fix's own
// lock guards it). The Keeper that wrote last stays the one Revert uses: a fix disabled by a
// reload, whose options fall back to the defaults, puts back what its record says, wherever the
// new configuration would keep one.
type Keepers struct {
	sys  Sysctl
	file string

	dir     string
	current *Keeper
}

// NewKeepers returns the Keepers of sys recording in file (a name) under a state directory. No I/O.
func NewKeepers(sys Sysctl, file string) *Keepers {
	return &Keepers{sys: sys, file: file}
}

// In returns the Keeper recording in dir ("" keeps the record in memory only), the same Keeper
// as long as dir does not change.
func (ks *Keepers) In(dir string) *Keeper {
	if ks.current == nil || ks.dir != dir {
		path := ""
		if dir != "" {
			path = filepath.Join(dir, ks.file)
		}
		ks.current, ks.dir = NewKeeper(ks.sys, path), dir
	}
	return ks.current
}

// ToRevert returns the Keeper In last returned, or, in a process that has not written yet (a fix
// disabled at start), the Keeper of dir.
func (ks *Keepers) ToRevert(dir string) *Keeper {
	if ks.current != nil {
		return ks.current
	}
	return ks.In(dir)
}

// Revert reverts through ToRevert(dir) and logs what it restored and what someone else changed
// since (left as they set it); what names the settings in the log lines ("the reserved ports").
func (ks *Keepers) Revert(dir string, log *slog.Logger, what string) error {
	restored, left, err := ks.ToRevert(dir).Revert()
	if len(restored) > 0 {
		log.Info("restored the previous value of "+what, "sysctls", restored)
	}
	if len(left) > 0 {
		log.Warn("someone else changed "+what+" since; leaving their values", "sysctls", left)
	}
	return err
}
