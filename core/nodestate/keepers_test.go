package nodestate

import "testing"

func TestKeepersRevertWhatTheyWrote(t *testing.T) {
	sys := NewFakeSysctl(map[string]string{"a": "1"})
	ks := NewKeepers(sys, "state.json")
	first := t.TempDir()
	if ks.In(first) != ks.In(first) {
		t.Fatal("In gave two Keepers for one directory")
	}
	if _, err := ks.In(first).Set(map[string]string{"a": "2"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ks.ToRevert(t.TempDir()).Revert(); err != nil || sys.Values["a"] != "1" {
		t.Errorf("Revert with another directory configured: %v, a=%q, want 1", err, sys.Values["a"])
	}
	// A process that never wrote reverts from the configured directory's record.
	if _, err := NewKeepers(sys, "state.json").In(first).Set(map[string]string{"a": "3"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := NewKeepers(sys, "state.json").ToRevert(first).Revert(); err != nil || sys.Values["a"] != "1" {
		t.Errorf("Revert after a restart: %v, a=%q, want 1", err, sys.Values["a"])
	}
}
