package errtree

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestLeaves(t *testing.T) {
	a, b, c := errors.New("a"), errors.New("b"), errors.New("c")
	wrappedC := fmt.Errorf("option x: %w", c)
	tree := fmt.Errorf("config: %w", errors.Join(a, errors.Join(b, wrappedC)))
	if got, want := Leaves(tree), []error{a, b, wrappedC}; !slices.Equal(got, want) {
		t.Errorf("Leaves = %v, want %v (a wrapped leaf stays whole)", got, want)
	}
	if got := Leaves(a); !slices.Equal(got, []error{a}) {
		t.Errorf("Leaves of a single error = %v, want it alone", got)
	}
	if got := Leaves(nil); got != nil {
		t.Errorf("Leaves(nil) = %v, want nil", got)
	}
}
