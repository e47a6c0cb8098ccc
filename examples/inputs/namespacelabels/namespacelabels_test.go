package namespacelabels_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"example.com/nnm-examples/inputs/namespacelabels"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
		Annotations: map[string]string{"big": "dropped by the transform"}}}
}

// TestInputFillsTheTable runs the input on testkit's Source as the agent would: Start, Synced,
// then every event moves the revision, signals a change and shows in Value, stripped.
func TestInputFillsTheTable(t *testing.T) {
	src := testkit.NewSource(t, "", namespace("b", map[string]string{"exempt": "true"}), namespace("a", nil))
	in := namespacelabels.New()
	if err := in.Synced(); err == nil {
		t.Fatal("synced before Start")
	}
	if err := in.Start(src); err != nil {
		t.Fatal(err)
	}
	if err := in.Synced(); err != nil {
		t.Fatalf("not synced after the first list: %v", err)
	}
	got := in.Value().([]*corev1.Namespace)
	if len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" || got[1].Annotations != nil {
		t.Fatalf("Value = %v, want a, b stripped of annotations", got)
	}
	rev := in.Revision()
	src.Add(namespace("c", map[string]string{"exempt": "true"}))
	if in.Revision() == rev || src.Changes() == 0 {
		t.Fatalf("an added Namespace did not move the revision (%d) or signal a change (%d)", in.Revision(), src.Changes())
	}
	src.Delete(namespace("b", nil))
	snap := fix.NewSnapshot(fix.Env{}, nil)
	namespacelabels.Table.Set(snap, in.Value().([]*corev1.Namespace))
	if got := namespacelabels.Labelled(namespacelabels.Table.Get(snap), "exempt", "true"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("Labelled = %v, want [c]", got)
	}
}
