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

// predecessorPoll is how often the takeover waits for the first successful sync.
var predecessorPoll = 500 * time.Millisecond

// CleanPredecessor removes the predecessor's chains once this agent has taken over: after the first
// fix synced successfully, in every configured family, once per process. Our rules go in before the
// predecessor's go out, so the node is never without either. With no fix enabled nothing is taken
// over and nothing is removed; a backend that is not a PredecessorCleaner (nftables) leaves the
// predecessor's iptables chains to `network-node-manager cleanup`. When chains were removed, a
// PredecessorTakenOver Event is posted on the Node.
func CleanPredecessor(lc fx.Lifecycle, be backend.Backend, e *engine.Engine, cfg *config.Config, ev EventsIn, log *slog.Logger) {
	pc, ok := be.(PredecessorCleaner)
	if !ok {
		return
	}
	t := &takeover{pc: pc, families: cfg.ParsedFamilies(), synced: func() bool {
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
	pc       PredecessorCleaner
	families []rules.Family
	synced   func() bool
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
