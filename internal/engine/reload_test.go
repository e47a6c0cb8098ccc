package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// A reload that enables a fix whose ServiceCIDRs input cannot start is rejected naming that table:
// the table's name comes from its input, so no list can leave one out (the registry's list of
// watches used to, and said "(none)").
func TestReloadRejectionNamesEveryTable(t *testing.T) {
	src := newMemSource()
	src.cidrs.startErr = errors.New("no API client")
	f := &nodeFix{id: "reads-cidrs", reads: []fix.TableRef{inputs.ServiceCIDRs}}
	rejected := &rejections{}
	e := mustNew(t, Options{Fixes: []fix.Fix{f}, Hub: src.hub, Inputs: src.ins(), Notify: rejected})
	on := config.Defaults()
	on.Fixes = map[string]map[string]any{"reads-cidrs": {"enabled": true}}
	if e.applyConfig(context.Background(), &on) {
		t.Fatal("a reload whose input cannot start was taken")
	}
	if len(rejected.errs) != 1 || !strings.Contains(rejected.errs[0].Error(), "fix reads-cidrs (ServiceCIDRs)") {
		t.Fatalf("ConfigRejected got %v; want the fix and its table ServiceCIDRs named", rejected.errs)
	}
}
