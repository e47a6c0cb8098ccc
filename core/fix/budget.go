package fix

import "fmt"

// Budgets bound what the Services of one tenant can make the agent hold and program through a
// ServiceMap (issue #41: four LoadBalancer Services of 30,000 ports each, which the API accepts,
// took the agent to 214 MB against the DaemonSet's 128Mi limit). Entries are counted as the
// per-Service function wants them (distinct keys), in namespace/name order: a Service whose entries
// do not fit is skipped whole, in every family (a dual-stack Service is never half programmed, and
// the family the engine computes first takes nothing from the Services before it in the other),
// with a reason naming it, and every other Service is programmed.
//
// The figures come from the memory limit (deploy/base/daemonset.yaml: 128Mi, GOMEMLIMIT 64MiB) and
// what an entry costs the agent at its peak, measured against the real apiserver and kernel with
// the DaemonSet's settings (`go run ./bench -hostile 4x30000,12x5000 -manifest`, peak RSS = VmHWM
// through the cold start and an update of every hostile Service, 2026-12-03, a loaded 2-core machine):
//
//   - the target is a peak RSS of at most 96 MiB, 25 % under the limit;
//   - the floor a tenant can make without any entry: four 30,000-port Services, cached and
//     refused, 54.3-64.8 MiB (iptables), 61.4 MiB (nftables);
//   - an entry costs 0.4-0.55 KiB at the peak on top of that (50,000 entries: 73.4-91.5 MiB with
//     iptables, 81.1 MiB with nftables), and 0.8-1.05 KiB when 120,000 of them are programmed
//     without budgets (159.3 and 184.3 MiB: the agent of d0ea2ac; GOMEMLIMIT no longer holds the
//     heap there);
//   - so (96 − 65) MiB at 0.55-0.65 KiB per entry is 50,000-57,000 entries: MaxEntriesPerFix is
//     50,000, both families together (the fix renders and applies its families at once). It is
//     also what the scale runs of 50,000 one-entry Services measured within the limit (81.8 and
//     86.4 MiB).
//
// Every overflow is a Skip with one of the reasons below; the engine counts them in
// nnm_fix_objects_skipped and logs them with the Service's name.
const (
	// MaxEntriesPerService is the most entries one Service may have (its External-IPs × its
	// ports, per family). The API bounds neither (a 1.5 MB object holds 30,000 ports, or 1,000 IPs ×
	// 1,000 ports = a million entries); 5,000 is far above any Service seen in practice and a tenth
	// of MaxEntriesPerFix.
	MaxEntriesPerService = 5000
	// MaxEntriesPerNamespace is the most entries the Services of one namespace may have together
	// (per family): one tenant can take at most half of MaxEntriesPerFix.
	MaxEntriesPerNamespace = 25000
	// MaxEntriesPerFix is the most entries one fix's map may have, both families together (see
	// above).
	MaxEntriesPerFix = 50000
)

// The skip reasons of the budgets.
const (
	ReasonServiceBudget   = "service-budget"
	ReasonNamespaceBudget = "namespace-budget"
	ReasonFixBudget       = "fix-budget"
)

// Budget is what a ServiceMap lets in; DefaultBudget unless ServiceMap.WithBudget says otherwise.
type Budget struct {
	// PerService and PerNamespace bound the entries of one Service and of one namespace's Services in
	// one family; PerMap bounds the entries of the map in all families together.
	PerService, PerNamespace, PerMap int
}

// DefaultBudget is the budget of the constants above.
var DefaultBudget = Budget{PerService: MaxEntriesPerService, PerNamespace: MaxEntriesPerNamespace, PerMap: MaxEntriesPerFix}

// OverServiceBudget returns the skip of a Service that would want n entries when n is above
// MaxEntriesPerService, so that a per-Service function can refuse a Service before it makes its
// entries (n = addresses × ports can be millions); ServiceMap applies the same bound to what it is
// given.
func OverServiceBudget(n int) (Skip, bool) {
	return serviceBudgetSkip("", n, MaxEntriesPerService)
}

func serviceBudgetSkip(object string, n, limit int) (Skip, bool) {
	if n <= limit {
		return Skip{}, false
	}
	return Skip{Object: object, Reason: ReasonServiceBudget, Detail: fmt.Sprintf("the Service wants %d entries, more than the %d one Service may have (fix.MaxEntriesPerService); none of them is programmed", n, limit)}, true
}
