package waitgroup

import (
	"sync"
	"testing"
)

func TestUntil(t *testing.T) {
	var wg sync.WaitGroup
	if !Until(&wg, make(chan struct{})) {
		t.Error("Until of a finished group = false, want true")
	}
	wg.Add(1)
	stop := make(chan struct{})
	close(stop)
	if Until(&wg, stop) {
		t.Error("Until of a running group after stop = true, want false")
	}
	wg.Done()
}
