package detect

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/internal/toolslot"
)

// TestIptablesSaveTakesTheToolSlot: detection's and the diagnosis's iptables-save waits while
// another iptables-save or -restore of the agent runs (toolslot), so that the agent's memory cgroup
// is never charged for two of them at once.
func TestIptablesSaveTakesTheToolSlot(t *testing.T) {
	release, err := toolslot.Acquire(context.Background(), "the backend's restore")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = IptablesSaveCounters(ctx, "nft", "ipv4", "filter")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another") {
		t.Fatalf("iptables-save while the slot is held: %v, want it to wait until the deadline", err)
	}
}
