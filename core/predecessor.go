package core

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/fx"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/config"
	"github.com/network-node-manager/network-node-manager/core/engine"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// PredecessorCleaner is implemented by backends that can remove the rules of the agent this one
// replaces (Kakao's network-node-manager: NMANAGER_* chains and the jumps to them) in one family,
// leaving everything else alone, and returns how many chains it removed. The iptables backend
// implements it.
//
// The takeover does not use go-iptables (which core/detect uses to read the iptables version and
// features): the backend already removes chains and every jump to them in one iptables-save and one
// iptables-restore per family, the same code as `cleanup`, through its command runner (which the
// tests point into a network namespace). go-iptables would list each built-in chain and delete each
// jump and chain with its own process, and add a second removal path beside the one `cleanup` needs.
type PredecessorCleaner interface {
	CleanupPredecessor(ctx context.Context, family rules.Family) (removed int, err error)
}

// Leftovers removes what this agent's other backend left in the kernel in an earlier run (the
// backend changed between runs: kube-proxy moved from IPVS to nftables mode and `backend: auto`
// followed it, or the ConfigMap changed it) and returns how many chains or tables it removed. The
// run command provides it (backends.Leftovers); CleanPredecessor calls it once our rules are in.
type Leftovers func(ctx context.Context) (removed int, err error)

// LeftoversIn is the optional Leftovers of the graph.
type LeftoversIn struct {
	fx.In
	Clean Leftovers `optional:"true"`
}

// predecessorPoll is how often the takeover waits for the first successful sync.
var predecessorPoll = 500 * time.Millisecond

// CleanPredecessor removes the predecessor's chains once this agent has taken over: after the first
// fix synced successfully, in every configured family, once per process. Our rules go in before the
// predecessor's go out, so the node is never without either. With no fix enabled nothing is taken
// over and nothing is removed; a backend that is not a PredecessorCleaner (nftables) leaves the
// predecessor's iptables chains to `network-node-manager cleanup`. When chains were removed, a
// PredecessorTakenOver Event is posted on the Node. At the same moment the other backend's leftovers
// go (lo), so that a backend switch never leaves the node without rules, nor with both sets.
func CleanPredecessor(lc fx.Lifecycle, be backend.Backend, e *engine.Engine, cfg *config.Config, ev EventsIn, lo LeftoversIn, log *slog.Logger) {
	pc, _ := be.(PredecessorCleaner)
	if pc == nil && lo.Clean == nil {
		return
	}
	t := &takeover{pc: pc, leftovers: lo.Clean, families: cfg.ParsedFamilies(), synced: func() bool {
		for _, st := range e.Statuses() {
			if st.Enabled && !st.LastOK.IsZero() {
				return true
			}
		}
		return false
	}, takenOver: ev.Recorder.PredecessorTakenOver, log: log}
	lc.Append(fx.Hook{OnStart: t.start, OnStop: t.stop})
}

type takeover struct {
	pc        PredecessorCleaner // nil: nothing to take over from the predecessor
	leftovers Leftovers          // nil: no other backend to clean after
	families  []rules.Family
	synced    func() bool
	// takenOver hears how many chains were removed, when any were.
	takenOver func(chains int, families []rules.Family)
	log       *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (t *takeover) start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tick := time.NewTicker(predecessorPoll)
		defer tick.Stop()
		for !t.synced() {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		t.clean(ctx)
	}()
	return nil
}

func (t *takeover) clean(ctx context.Context) {
	if t.leftovers != nil {
		n, err := t.leftovers(ctx)
		if err != nil {
			// Not fatal either: our rules are in; `cleanup` removes both backends' objects.
			t.log.Warn("could not remove what the other backend left", "err", err)
		}
		if n > 0 {
			t.log.Info("removed what the other backend left from an earlier run", "chains_or_tables", n)
		}
	}
	if t.pc == nil {
		return
	}
	total := 0
	var from []rules.Family
	for _, f := range t.families {
		n, err := t.pc.CleanupPredecessor(ctx, f)
		if err != nil {
			// Not fatal: the predecessor's leftovers do not stop our fixes; `cleanup` removes them too.
			t.log.Warn("could not remove the predecessor's NMANAGER_ chains", "family", f, "err", err)
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

func (t *takeover) stop(context.Context) error {
	if t.cancel != nil {
		t.cancel()
	}
	t.wg.Wait()
	return nil
}
