package agent

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/engine"
)

// PredecessorCleaner is implemented by backends that can remove the rules of the agent this one
// replaces (Kakao's network-node-manager: NMANAGER_* chains and the jumps to them) in one family,
// leaving everything else alone, and returns how many chains it removed: those for which match is
// true (nil: all of them). The iptables backend implements it.
//
// The takeover does not use go-iptables (which internal/detect uses to read the iptables version and
// features): the backend already removes chains and every jump to them in one iptables-save and one
// iptables-restore per family, the same code as `cleanup`, through its command runner (which the
// tests point into a network namespace). go-iptables would list each built-in chain and delete each
// jump and chain with its own process, and add a second removal path beside the one `cleanup` needs.
type PredecessorCleaner interface {
	CleanupPredecessor(ctx context.Context, family rules.Family, match func(chain string) bool) (removed int, err error)
}

// predecessorChainsOf says which of the predecessor's chains a fix of ours replaces: its conntrack
// INVALID drop (NMANAGER_DROP_INVALID_INPUT) is invalid-drop's; the rest of what it left (its
// External-IP DNAT: NMANAGER_PREROUTING, NMANAGER_EX_CLUS_IP, NMANAGER_EXTCLUSTER_*, NMANAGER_MARK)
// is ipvs-externalip-dnat's. nil: none.
func predecessorChainsOf(fix string) func(chain string) bool {
	invalid := func(c string) bool { return strings.Contains(c, "INVALID") }
	switch fix {
	case "invalid-drop":
		return invalid
	case "ipvs-externalip-dnat":
		return func(c string) bool { return !invalid(c) }
	}
	return nil
}

// Leftovers removes what this agent's other backend left in the kernel in an earlier run (the
// backend changed between runs: kube-proxy moved from IPVS to nftables mode and `backend: auto`
// followed it, or the ConfigMap changed it): the objects of fix, or everything when fix is "", and
// returns how many chains or tables it removed. The run command provides it (backends.Leftovers);
// CleanPredecessor calls it once our rules of that fix are in.
type Leftovers func(ctx context.Context, fix string) (removed int, err error)

// LeftoversIn is the optional Leftovers of the graph.
type LeftoversIn struct {
	fx.In
	Clean Leftovers `optional:"true"`
}

// predecessorPoll is how often the takeover waits for the first successful sync.
var predecessorPoll = 500 * time.Millisecond

// CleanPredecessor removes the predecessor's chains and the other backend's leftovers once this
// agent has taken over, make before break, fix by fix (#41: removed when the first fix synced, the
// External-IP DNAT went 76 s before its replacement while the API server was unreachable): a fix's
// share of them goes once that fix synced successfully in every family it programs; the rest (the
// objects of fixes that are not enabled, and of fixes this build does not have) once every enabled
// fix has. Our rules go in before the predecessor's go out, so the node is never without either, nor
// with both sets longer than a fix takes to sync. With no fix enabled nothing is taken over and
// nothing is removed; a backend that is not a PredecessorCleaner (nftables) leaves the predecessor's
// iptables chains to `network-node-manager cleanup`. When chains were removed, a
// PredecessorTakenOver Event is posted on the Node. The same path serves a backend switch while the
// agent runs (Takeover.Switched).
func CleanPredecessor(lc fx.Lifecycle, t *Takeover) {
	lc.Append(fx.Hook{OnStart: t.start, OnStop: t.stop})
}

// Takeover runs the make-before-break clean-ups: the one at start (the predecessor's chains, what
// the other backend left from an earlier run) and one per backend switch while the agent runs
// (Switched), each fix by fix.
type Takeover struct {
	base takeover // families, statuses, takenOver, log: what every job shares

	mu   sync.Mutex // held by a step in progress and by Switched
	jobs []*job
	wake chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type job struct {
	t    *takeover
	done map[string]bool
}

// NewTakeover returns the takeover of the agent's start: it removes the predecessor's chains when be
// (or the backend a Live holds) is a PredecessorCleaner, and the other backend's leftovers when lo has
// them. It does no I/O.
func NewTakeover(be backend.Backend, e *engine.Engine, cfg *config.Config, ev EventsIn, lo LeftoversIn, log *slog.Logger) *Takeover {
	if l, ok := be.(interface{ Current() backend.Backend }); ok {
		be = l.Current()
	}
	pc, _ := backend.As[PredecessorCleaner](be)
	base := takeover{families: cfg.ParsedFamilies(), statuses: e.Statuses, takenOver: ev.Recorder.PredecessorTakenOver, log: log}
	t := &Takeover{base: base, wake: make(chan struct{}, 1)}
	if pc != nil || lo.Clean != nil {
		first := base
		first.pc, first.leftovers = pc, lo.Clean
		t.jobs = []*job{{t: &first, done: map[string]bool{}}}
	}
	return t
}

// Switched starts the clean-up after a switch to the backend named name while the agent runs:
// leftovers (what the backend switched from holds) of a fix go once the fix has synced with the new
// backend in every family, the rest once every enabled fix has. Jobs still running stop removing what
// their other backend holds, which is now the backend in use (the predecessor's chains still go as
// before). Call it before the engine switches (engine.Follow): when it returns, no removal of the
// earlier jobs is in progress.
func (t *Takeover) Switched(leftovers Leftovers, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, j := range t.jobs {
		j.t.leftovers = nil
	}
	next := t.base
	next.leftovers, next.backend = leftovers, name
	t.jobs = append(t.jobs, &job{t: &next, done: map[string]bool{}})
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// Pending reports whether a clean-up has work left.
func (t *Takeover) Pending() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.jobs) > 0
}

func (t *Takeover) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tick := time.NewTicker(predecessorPoll)
		defer tick.Stop()
		for {
			t.round(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.wake:
			case <-tick.C:
			}
		}
	}()
	return nil
}

// round runs a step of every job and drops the jobs that are done.
func (t *Takeover) round(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var left []*job
	for _, j := range t.jobs {
		if !j.t.step(ctx, j.done) {
			left = append(left, j)
		}
	}
	t.jobs = left
}

func (t *Takeover) stop(context.Context) error {
	if t.cancel != nil {
		t.cancel()
	}
	t.wg.Wait()
	return nil
}

type takeover struct {
	pc        PredecessorCleaner // nil: nothing to take over from the predecessor
	leftovers Leftovers          // nil: no other backend to clean after
	// backend: a fix counts as synced only once it synced with this backend ("": any), for a
	// switch while running.
	backend  string
	families []rules.Family
	statuses func() []engine.Status
	// takenOver hears how many chains were removed, when any were.
	takenOver func(chains int, families []rules.Family)
	log       *slog.Logger
}

// step cleans after every enabled fix that synced since the last step (recorded in done) and,
// once all of them have, after the rest; true: nothing is left to do.
func (t *takeover) step(ctx context.Context, done map[string]bool) bool {
	enabled, waiting := 0, 0
	for _, st := range t.statuses() {
		if !st.Enabled || st.NodeState {
			continue
		}
		enabled++
		if done[st.Fix] {
			continue
		}
		if st.LastOK.IsZero() || (t.backend != "" && st.Backend != t.backend) {
			waiting++
			continue
		}
		t.clean(ctx, st.Fix, predecessorChainsOf(st.Fix))
		done[st.Fix] = true
	}
	if enabled == 0 || waiting > 0 {
		return false
	}
	t.clean(ctx, "", nil)
	return true
}

// clean removes the other backend's objects of fix ("": all) and the predecessor's chains that
// match (nil with fix "": all; nil otherwise: none).
func (t *takeover) clean(ctx context.Context, fix string, match func(string) bool) {
	if t.leftovers != nil {
		n, err := t.leftovers(ctx, fix)
		if err != nil {
			// Not fatal either: our rules are in; `cleanup` removes both backends' objects.
			t.log.Warn("could not remove what the other backend left", "fix", fix, "err", err)
		}
		if n > 0 {
			if t.backend != "" {
				t.log.Info("removed what the backend switched from held", "fix", fix, "backend", t.backend, "chains_or_tables", n)
			} else {
				t.log.Info("removed what the other backend left from an earlier run", "fix", fix, "chains_or_tables", n)
			}
		}
	}
	if t.pc == nil || (fix != "" && match == nil) {
		return
	}
	total := 0
	var from []rules.Family
	for _, f := range t.families {
		n, err := t.pc.CleanupPredecessor(ctx, f, match)
		if err != nil {
			// Not fatal: the predecessor's leftovers do not stop our fixes; `cleanup` removes them too.
			t.log.Warn("could not remove the predecessor's NMANAGER_ chains", "family", f, "fix", fix, "err", err)
		}
		if n > 0 {
			total += n
			from = append(from, f)
		}
	}
	if total > 0 && t.takenOver != nil {
		t.takenOver(total, from)
	}
}
