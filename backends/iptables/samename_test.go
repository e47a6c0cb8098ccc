package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/backend"
)

// TestKernelSameNamedForeignChain (issue #63 row 1): a chain named like one of a fix's,
// NNM-INVALID-INPUT, that no jump commented network-node-manager:invalid-drop leads to, holding
// someone else's rule. At main 3f85643 the apply declared it in its restore, which flushed the
// foreign rule, and jumped to it from INPUT, so that cleanup then took it for ours. Now the apply
// fails with a backend.ForeignError naming the chain and changes nothing; removing the fix and
// cleanup leave it byte-identical, as CleanupPlan says.
func TestKernelSameNamedForeignChain(t *testing.T) {
	ctx := context.Background()
	forEachKernel(t, func(t *testing.T, k *kernel) {
		k.ipt("-N", "NNM-INVALID-INPUT")
		k.ipt("-A", "NNM-INVALID-INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
		before := k.save()
		b := k.backend()
		rs := invalidDrop(k.family)
		err := apply(ctx, b, rs)
		var fe *backend.ForeignError
		if !errors.As(err, &fe) || !strings.HasPrefix(fe.Object, "chain NNM-INVALID-INPUT of table filter") {
			t.Fatalf("apply over the foreign chain: %v, want a ForeignError naming chain NNM-INVALID-INPUT of table filter", err)
		}
		if after := k.save(); after != before {
			t.Errorf("the apply changed the kernel:\n%s\nwas:\n%s", after, before)
		}
		plan, err := opsOf(b).CleanupPlan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(plan) != 0 {
			t.Errorf("CleanupPlan = %q, want nothing", plan)
		}
		if err := remove(ctx, b, rs.Fix, k.family); err != nil {
			t.Fatal(err)
		}
		if err := b.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
		if after := k.save(); after != before {
			t.Errorf("removing the fix or cleanup changed the kernel:\n%s\nwas:\n%s", after, before)
		}
	})
}
