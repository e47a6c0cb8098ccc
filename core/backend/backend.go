// Package backend defines the interface through which the core programs rules into the kernel.
//
// A backend owns a namespace of kernel objects (iptables chains named "NNM-…"; nftables tables named
// "nnm-<fix>", one per fix and family) and never touches anything else, except the jump rules it adds
// to built-in iptables chains. Each call is about one fix and one family, so fixes never disturb each other.
//
// Every backend is a Driver (driver.go) over the backend's Ops: New(ops) returns the Backend. The
// Driver keeps a record of what the last reconcile of each (fix, family) left in the kernel, and
// is the one place that decides what changed, how far that record is trusted and when the kernel
// is read back and repaired: callers only say which Mode they want; a backend supplies the few
// operations that touch its kernel.
package backend

import (
	"context"
	"errors"
	"fmt"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// The backends' names: the values of the config key backend (besides "auto"), the backend="…"
// metric label, and what Backend.Name returns. One place for them; everything else refers here.
const (
	IPTables = "iptables"
	NFTables = "nftables"
)

// Names lists the backends in a stable order.
var Names = []string{IPTables, NFTables}

// Counter is a packet/byte counter read from the kernel.
type Counter struct {
	Packets uint64
	Bytes   uint64
}

// Mode says how much of the kernel a Reconcile checks before it changes anything.
type Mode int

const (
	// Trust takes the record of the last reconcile as the kernel's state and sends only the difference
	// between it and the desired ruleset (nothing when they are equal). Without a record (nothing
	// reconciled yet in this process, or the last attempt failed) the kernel is read first.
	Trust Mode = iota
	// Verify first makes sure the kernel still holds what the record says, and restores it when not
	// (Result.Repaired). A backend may prove "unchanged" without listing anything (the nf_tables
	// generation id); otherwise it reads back its own objects.
	Verify
)

func (m Mode) String() string {
	if m == Verify {
		return "verify"
	}
	return "trust"
}

// Result says what one Reconcile did.
type Result struct {
	// Applied: a transaction changed the kernel.
	Applied bool
	// Repaired: our objects were found changed or deleted behind our back (by Verify, or in the
	// read-back right after our own change: ErrInterfered) and were restored.
	Repaired bool
	// ReadBack: the kernel's state was listed (iptables-save, nft list …) during the call.
	ReadBack bool
	// Absent: the unit holds nothing now (a removal, or one known done before).
	Absent bool
	// Rejected: objects whose rules the kernel refused; everything else of the ruleset is in the
	// kernel. Reported on every Reconcile while they stay refused (the caller reports them as
	// skips: ReasonRejected).
	Rejected []Rejection
}

// Backend renders rulesets and reconciles the kernel with them.
type Backend interface {
	// Name is "iptables" or "nftables"; it labels metrics.
	Name() string
	// Render returns exactly the input the backend would feed its kernel tool to make the kernel hold rs
	// (iptables-restore or nft -f text), touching nothing. Used by `plan` and golden tests.
	Render(rs *rules.Ruleset) (string, error)
	// Reconcile makes the kernel hold exactly desired for (fix, family) in one atomic step: objects
	// of the fix that desired no longer has are removed; a nil desired removes everything of the fix
	// in family (removing what is not there is not an error). mode says whether the record of the last
	// reconcile is trusted or checked against the kernel first. On error the previous state of the
	// fix stays in place. If ctx ends while the kernel is being read, nothing is changed and ctx's
	// error is returned, so a caller can cancel a Verify to let something more urgent through.
	// A ruleset with desired.Revision set (the engine sets one per computation) and the unit's last
	// Revision is unchanged without a look at its entries. The Driver keeps desired's map entries
	// (not a copy) in its record, so the caller never modifies the entries of a slice it has passed
	// (fix.ServiceMap never does; the test fake fails a reconcile that finds them modified).
	Reconcile(ctx context.Context, fix string, family rules.Family, desired *rules.Ruleset, mode Mode) (Result, error)
	// Counters reads the named counters (Rule.Counter) of fix in family.
	Counters(ctx context.Context, fix string, family rules.Family) (map[string]Counter, error)
	// Cleanup removes everything the backend owns in every family, whatever fix put it there.
	Cleanup(ctx context.Context) error
}

// ErrForeign is wrapped by the error of a Reconcile that found an object of the name one of the
// unit's objects must have, which the backend cannot prove it made (a ForeignError names it). The
// object is left untouched and nothing of the unit is changed: the fix is blocked in that family
// until its owner removes or renames it. Cleanup never takes such an object either.
var ErrForeign = errors.New("an object of the same name is someone else's")

// ForeignError is the error that names the foreign object; it wraps ErrForeign.
type ForeignError struct {
	// Object is the object as the backend's tool names it: "table ip6 nnm-invalid-drop",
	// "chain NNM-INVALID-INPUT of table filter (ip6tables-nft)".
	Object string
	// Why says what shows it is not ours ("its comment is …", "no jump commented … leads to it").
	Why string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("%s exists and is not ours (%s): left untouched; the fix is blocked here until it is removed or renamed", e.Object, e.Why)
}

func (e *ForeignError) Unwrap() error { return ErrForeign }

// CleanupPlanner is implemented by backends that can say what Cleanup would remove without removing
// anything (`cleanup --dry-run`).
type CleanupPlanner interface {
	// CleanupPlan lists, one line each, the chains or tables Cleanup would delete now.
	CleanupPlan(ctx context.Context) ([]string, error)
}
