// Package waitgroup waits for a sync.WaitGroup for a bounded time: what a Stop does that must not
// hang on goroutines that do not end.
package waitgroup

import "sync"

// Until waits for wg until stop delivers or is closed, and reports whether wg finished first. When
// it did not, one goroutine stays blocked on wg until wg finishes.
func Until[T any](wg *sync.WaitGroup, stop <-chan T) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-stop:
		return false
	}
}
