package fix

import (
	"slices"

	"github.com/network-node-manager/network-node-manager/core/backend"
)

// ReasonRejected is the skip reason of an object whose rules the kernel refused
// (backend.ReasonRejected): the rest of the fix's rules are programmed without them.
const ReasonRejected = backend.ReasonRejected

// WithRejected is r with the objects whose rules the kernel refused (backend.Result.Rejected) as
// skips: they got no rules. The engine (and testkit's FixEnv) report a unit's skips through it.
// Covered stays what the fix computed: an object may be a part of what the fix counts (one port of
// a Service).
func (r Report) WithRejected(rejected []backend.Rejection) Report {
	if len(rejected) == 0 {
		return r
	}
	r.Skipped = slices.Clone(r.Skipped)
	for _, x := range rejected {
		r.Skipped = append(r.Skipped, Skip{Object: x.Object, Reason: ReasonRejected, Detail: x.Detail})
	}
	return r
}
