package fix

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestErrorLeaves(t *testing.T) {
	a, b, c := errors.New("a"), errors.New("b"), errors.New("c")
	wrappedC := fmt.Errorf("option x: %w", c)
	tree := fmt.Errorf("config: %w", errors.Join(a, errors.Join(b, wrappedC)))
	if got, want := ErrorLeaves(tree), []error{a, b, wrappedC}; !slices.Equal(got, want) {
		t.Errorf("Leaves = %v, want %v (a wrapped leaf stays whole)", got, want)
	}
	if got := ErrorLeaves(a); !slices.Equal(got, []error{a}) {
		t.Errorf("Leaves of a single error = %v, want it alone", got)
	}
	if got := ErrorLeaves(nil); got != nil {
		t.Errorf("ErrorLeaves(nil) = %v, want nil", got)
	}
}
