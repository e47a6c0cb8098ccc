package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/core/testkit"
	"github.com/network-node-manager/network-node-manager/internal/config"
)

// ipvsOnly is on by default in IPVS mode and refuses every other mode, as ipvs-externalip-dnat does.
type ipvsOnly struct{ countFix }

func (f *ipvsOnly) DefaultEnabled(env fix.Env) bool { return env.ProxyMode == "ipvs" }
func (f *ipvsOnly) Check(env fix.Env) error {
	if env.ProxyMode != "ipvs" && env.ProxyMode != "" {
		return errors.New("refusing to run in kube-proxy " + env.ProxyMode + " mode")
	}
	return nil
}

// named is a fake backend under another name, to tell two apart.
type named struct {
	*testkit.FakeBackend
	name string
}

func (n named) Name() string { return n.name }

type notes struct {
	nopNotifier
	refused, enabled []string
}

func (n *notes) FixRefused(f string, err error) { n.refused = append(n.refused, f+": "+err.Error()) }
func (n *notes) FixEnabled(f string)            { n.enabled = append(n.enabled, f) }

// Follow: when kube-proxy's mode leaves IPVS the IPVS-only fix is refused with its Check's reason
// (metric, status, Event), although only its default enabled it, and the next pass removes its rules;
// with a new backend every wanted unit applies there, the old one keeps its objects (the takeover's
// job), and each fix's status names the backend it last synced with. Back in IPVS mode the fix runs
// again and the refusal is gone.
func TestFollowModeAndBackend(t *testing.T) {
	ctx := context.Background()
	old := named{testkit.NewFakeBackend(), "old"}
	next := named{testkit.NewFakeBackend(), "new"}
	dnat := &ipvsOnly{countFix{id: "dnat"}}
	drop := &countFix{id: "drop", defaultOn: true}
	h := newHarness(t, nil, dnat, drop)
	n := &notes{}
	h.e.notify = n
	live := NewLive(old)
	h.e.be = live
	h.e.env = fix.Env{ProxyMode: "ipvs"}
	h.e.mu.Lock()
	h.e.evaluateLocked()
	h.e.mu.Unlock()
	h.src.set(svc("a", "10.96.0.1"))
	h.e.SyncOnce(ctx, true)
	if old.Ruleset("dnat", rules.IPv4) == nil || old.Ruleset("drop", rules.IPv4) == nil {
		t.Fatal("both fixes should be applied in IPVS mode")
	}

	// kube-proxy's mode leaves IPVS, kept backend: the DNAT goes, with the reason.
	if err := h.e.Follow(fix.Env{ProxyMode: "nftables"}, nil); err != nil {
		t.Fatal(err)
	}
	h.e.SyncOnce(ctx, true)
	if old.Ruleset("dnat", rules.IPv4) != nil {
		t.Fatal("the IPVS-only fix's rules survived the mode change")
	}
	if old.Ruleset("drop", rules.IPv4) == nil {
		t.Fatal("the other fix's rules went")
	}
	if v := testutil.ToFloat64(h.m.Refused.WithLabelValues("dnat")); v != 1 {
		t.Errorf("nnm_fix_refused{fix=dnat} = %v, want 1", v)
	}
	if errs := h.e.Refusals(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "refusing to run in kube-proxy nftables mode") {
		t.Errorf("refusals = %v", errs)
	}
	if len(n.refused) != 1 || !strings.Contains(n.refused[0], "nftables mode") {
		t.Errorf("FixRefused told %v, want once with the reason", n.refused)
	}
	// A config reload keeps the refusal while the mode stays.
	c := config.Defaults()
	if !h.e.applyConfig(ctx, &c) {
		t.Fatal("reload rejected")
	}
	if errs := h.e.Refusals(); len(errs) != 1 {
		t.Errorf("after a reload, refusals = %v, want the mode's refusal kept", errs)
	}

	// Back to IPVS, and a backend switch: everything wanted goes to the new backend.
	n.enabled = nil
	if err := h.e.Follow(fix.Env{ProxyMode: "ipvs"}, next); err != nil {
		t.Fatal(err)
	}
	if errs := h.e.Refusals(); len(errs) != 0 {
		t.Errorf("back in IPVS mode, refusals = %v", errs)
	}
	if v := testutil.ToFloat64(h.m.Refused.WithLabelValues("dnat")); v != 0 {
		t.Errorf("nnm_fix_refused{fix=dnat} = %v, want 0", v)
	}
	if len(n.enabled) != 1 || n.enabled[0] != "dnat" {
		t.Errorf("FixEnabled told %v, want dnat", n.enabled)
	}
	for _, st := range h.e.Statuses() {
		if st.Backend == "new" {
			t.Errorf("%s: status names the new backend before any sync with it", st.Fix)
		}
	}
	h.e.SyncOnce(ctx, true)
	for _, id := range []string{"dnat", "drop"} {
		if next.Ruleset(id, rules.IPv4) == nil {
			t.Errorf("%s not applied with the new backend", id)
		}
	}
	if old.Ruleset("drop", rules.IPv4) == nil {
		t.Error("the old backend's objects went in the engine: that is the takeover's job, once each fix synced")
	}
	for _, st := range h.e.Statuses() {
		if st.Backend != "new" {
			t.Errorf("%s: status backend %q, want new", st.Fix, st.Backend)
		}
	}
	// The old backend's gauges are gone (they would read as stale rules and a stale last sync).
	if n := testutil.CollectAndCount(h.m.Rules); n != 4 {
		t.Errorf("nnm_rules_programmed has %d series, want 4 (two fixes, two families, the new backend only)", n)
	}
	if v := testutil.ToFloat64(h.m.LastSuccess.WithLabelValues("drop", "new")); v == 0 {
		t.Error("no last success with the new backend")
	}
	if n := testutil.CollectAndCount(h.m.LastSuccess); n != 2 {
		t.Errorf("nnm_last_successful_sync_timestamp_seconds has %d series, want 2 (the new backend's)", n)
	}
}

// Follow with a backend needs a Live: an engine on a plain backend says so and changes nothing.
func TestFollowBackendNeedsLive(t *testing.T) {
	h := newHarness(t, nil, &countFix{id: "drop", defaultOn: true})
	err := h.e.Follow(fix.Env{ProxyMode: "nftables"}, testkit.NewFakeBackend())
	if err == nil || !strings.Contains(err.Error(), "Live") {
		t.Fatalf("Follow = %v, want an error naming engine.Live", err)
	}
	if h.e.Env().ProxyMode != "" {
		t.Errorf("a refused Follow changed the environment: %+v", h.e.Env())
	}
}
