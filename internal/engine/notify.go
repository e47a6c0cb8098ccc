package engine

import "github.com/network-node-manager/network-node-manager/core/fix"

// Notifier hears what operators want to see on the Node (internal/events posts it as Kubernetes
// Events). Its methods are called from the workers and the dispatcher and must not block.
type Notifier interface {
	// FixEnabled: the fix runs (at start, or a reload enabled it).
	FixEnabled(fix string)
	// FixDisabled: a reload disabled a fix that ran.
	FixDisabled(fix string)
	// FixRefused: the config enabled the fix but it refuses to run here (fix.Checker).
	FixRefused(fix string, err error)
	// FixSynced: every wanted unit of the fix synced successfully for the first time since the fix
	// was enabled.
	FixSynced(fix string)
	// FixSyncFailed: a sync of one of the fix's units failed.
	FixSyncFailed(fix string, err error)
	// ObjectSkipped: a fix newly left an object out (fix.Skip) in family ("" for an Actuator).
	ObjectSkipped(fix, family string, skip fix.Skip)
	// ConfigRejected: a new configuration was not taken.
	ConfigRejected(err error)
}

type nopNotifier struct{}

func (nopNotifier) FixEnabled(string)                      {}
func (nopNotifier) FixDisabled(string)                     {}
func (nopNotifier) FixRefused(string, error)               {}
func (nopNotifier) FixSynced(string)                       {}
func (nopNotifier) FixSyncFailed(string, error)            {}
func (nopNotifier) ObjectSkipped(string, string, fix.Skip) {}
func (nopNotifier) ConfigRejected(error)                   {}

// announce tells the notifier how the fixes' states changed from before (nil: at start, every
// enabled or refused fix is news). A refusal is told once, not on every reload that keeps it.
func (e *Engine) announce(before []Status) {
	was := map[string]Status{}
	for _, s := range before {
		was[s.Fix] = s
	}
	for _, s := range e.Statuses() {
		old, known := was[s.Fix]
		switch {
		case s.Refusal != nil:
			if !known || old.Refusal == nil || old.Refusal.Error() != s.Refusal.Error() {
				e.notify.FixRefused(s.Fix, s.Refusal)
			}
		case s.Enabled && !(known && old.Enabled):
			e.notify.FixEnabled(s.Fix)
		case !s.Enabled && known && old.Enabled:
			e.notify.FixDisabled(s.Fix)
		}
	}
}
