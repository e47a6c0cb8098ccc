package fix

import (
	"fmt"

	"github.com/network-node-manager/network-node-manager/core/backend"
)

// Budgets bound what the Services of one tenant can make the agent hold and program through a
// ServiceMap (issue #41: four LoadBalancer Services of 30,000 ports each, which the API accepts,
// took the agent to 214 MB against the DaemonSet's 128Mi limit). Entries are counted as the
// per-Service function wants them (distinct keys), in namespace/name order: a Service whose entries
// do not fit is skipped whole, in every family (a dual-stack Service is never half programmed, and
// the family the engine computes first takes nothing from the Services before it in the other),
// with a reason naming it, and every other Service is programmed.
//
// The figures come from the memory limit (deploy/base/daemonset.yaml: 128Mi, GOMEMLIMIT 64MiB) and
// what entries cost the agent's memory cgroup at its peak: the agent, the iptables-restore/-save or
// nft processes it runs, the kernel memory of the rules they make (charged to the cgroup of the
// process that makes them, so to the agent's container) and page cache. The target is a cgroup peak
// of at most 96 MiB, 25 % under the limit. Measured with the DaemonSet's settings by
// `go run ./bench -n 10000,20000 -manifest` and `-n 50000 -manifest` (each agent in a memory cgroup
// with the 128Mi limit, cgroup v1, kernel 6.18, iptables 1.8.9 nf_tables, a loaded 2-core machine,
// 2026-12-04; one map entry per Service):
//
//   - nftables: an entry is one map element, 0.2 KiB of kernel memory at 10,000; the cgroup peaked
//     at 55.1 MiB at 10,000 and 99.4 MiB at 50,000 (anon 71.6, page cache 25.7, kernel 0.6 MiB):
//     MaxEntriesPerFix is 50,000, both families together, which the scale runs of 50,000 Services
//     held without an OOM kill (22 % spare, counting the page cache the kernel can reclaim);
//   - iptables: an entry is two rules (DNAT, and the masquerade by original destination), 1.6 KiB
//     of kernel memory, plus the iptables-save dump the agent reads (0.9 KB per rule): the cgroup
//     peaked at 80.2 MiB at 10,000 (kernel 15.8 MiB), and at 20,000 reached the limit itself
//     (128.0 MiB during the changes, the kernel reclaiming page cache; kernel 31.1 MiB), at least
//     4.9 KiB per entry; (96 − 80.2) MiB at that is 3,300 entries above 10,000:
//     MaxEntriesPerFixIPTables is 12,000. Before the entry rules lost their comments (2.6 KiB of
//     kernel memory per entry) the cgroup peaked at 95.9 MiB at 10,000.
//
// With another memory limit (config memoryLimit, Limits) the fix's budget is scaled from these
// figures (MaxEntriesPerFixAt). docs/deploy.md gives the limit for more entries; BENCHMARKS.md the hostile Services of issue #41
// (`go run ./bench -hostile 4x30000,12x5000 -manifest`) under these budgets.
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
	// MaxEntriesPerFix is the most entries one fix's map may have, both families together, with the
	// nftables backend (see above); MaxEntriesPerFixFor gives it per backend.
	MaxEntriesPerFix = 50000
	// MaxEntriesPerFixIPTables is MaxEntriesPerFix with the iptables backend: two rules per entry,
	// charged to the agent's memory cgroup with the dump the agent reads back (see above).
	MaxEntriesPerFixIPTables = 12000
)

// MemoryLimit is the memory limit the budgets were measured at: the DaemonSet's
// (deploy/base/daemonset.yaml; deploy's TestDaemonSet checks they agree), and the limit assumed
// when the agent is not told its own (config memoryLimit, which the DaemonSet sets from the
// container's limit through the downward API). The budgets aim at a memory cgroup peak of three
// quarters of the limit (25 % spare).
const MemoryLimit = 128 << 20

// maxEntriesPerFix is MaxEntriesPerFix per backend where it is lower: the most entries measured to
// keep the agent's memory cgroup 25 % under MemoryLimit with that backend (the figures above).
var maxEntriesPerFix = map[string]int{backend.IPTables: MaxEntriesPerFixIPTables}

// baseMemory is, per backend, the agent's memory cgroup peak with no entries, from the figures
// above: the peak at 10,000 entries less 10,000 times the cost of an entry (iptables: 80.2 MiB −
// 10,000 × 4.9 KiB; nftables: 55.1 MiB − 10,000 × (99.4 − 55.1) MiB / 40,000). What a limit other
// than MemoryLimit holds beyond it is given to entries at the same cost per entry.
var baseMemory = map[string]int64{
	backend.IPTables: 32<<20 + 6<<20/16, // 32.4 MiB
	backend.NFTables: 44 << 20,
}

// MaxEntriesPerFixFor is MaxEntriesPerFix with the named backend (backend.Backend.Name()), at
// MemoryLimit.
func MaxEntriesPerFixFor(backendName string) int {
	if n, ok := maxEntriesPerFix[backendName]; ok {
		return n
	}
	return MaxEntriesPerFix
}

// MaxEntriesPerFixAt is MaxEntriesPerFixFor the backend at the memory limit memLimit (bytes; 0 or
// less is MemoryLimit): the part of three quarters of the limit above the backend's base memory,
// at the measured cost per entry, so MaxEntriesPerFixFor × (¾·memLimit − base) / (¾·MemoryLimit −
// base), rounded down to a multiple of 100; 0 when three quarters of the limit do not exceed the
// base. A backend without measured figures (a test's) keeps MaxEntriesPerFixFor. Limits above
// MemoryLimit are extrapolated from figures measured at it (docs/deploy.md).
func MaxEntriesPerFixAt(backendName string, memLimit int64) int {
	n := MaxEntriesPerFixFor(backendName)
	base, ok := baseMemory[backendName]
	if memLimit <= 0 || memLimit == MemoryLimit || !ok {
		return n
	}
	room, measured := memLimit/4*3-base, int64(MemoryLimit)/4*3-base
	if room <= 0 {
		return 0
	}
	// In floating point: a limit of exabytes (a Pod without a limit gets the node's allocatable
	// memory through the downward API; a config value may be anything) must not overflow.
	return int(min(float64(n)*float64(room)/float64(measured), maxEntriesAtAnyLimit)) / 100 * 100
}

// maxEntriesAtAnyLimit bounds MaxEntriesPerFixAt whatever the limit (far above what any limit
// measured here holds: 50,000 entries at 128Mi).
const maxEntriesAtAnyLimit = 1 << 30

// BudgetFor is the Budget of a fix whose rules go to the named backend, in an agent whose memory
// limit is memLimit (bytes; 0 is MemoryLimit): DefaultBudget with the backend's
// MaxEntriesPerFixAt, and at most half of that per namespace.
func BudgetFor(backendName string, memLimit int64) Budget {
	b := DefaultBudget
	b.PerMap = MaxEntriesPerFixAt(backendName, memLimit)
	b.PerNamespace = min(b.PerNamespace, b.PerMap/2)
	b.PerService = min(b.PerService, b.PerNamespace)
	return b
}

// Limits are the resources the agent may use, from its configuration (memoryLimit): what budgets
// are derived from. The zero value is the DaemonSet's (MemoryLimit).
type Limits struct {
	// Memory is the memory limit in bytes; 0 means MemoryLimit.
	Memory int64
}

// MinBudget is the lowest of every backend's budget (BudgetFor), field by field: what a workload
// meant to be programmed whole on any backend (a benchmark's, a test cluster's) stays within.
func MinBudget() Budget {
	m := DefaultBudget
	for _, name := range backend.Names {
		b := BudgetFor(name, MemoryLimit)
		m.PerService, m.PerNamespace, m.PerMap = min(m.PerService, b.PerService), min(m.PerNamespace, b.PerNamespace), min(m.PerMap, b.PerMap)
	}
	return m
}

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
	return Skip{Object: object, Reason: ReasonServiceBudget, Detail: fmt.Sprintf("the Service wants %d entries, more than the %d one Service may have (fix.MaxEntriesPerService, or less at a lower memory limit: fix.BudgetFor); none of them is programmed", n, limit)}, true
}
