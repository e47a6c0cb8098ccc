package testkit

import "sync"

// Counts counts operations by name and is safe for concurrent use: what a fake kernel or a wrapped
// command runner records, so that a test can assert which operations ran (and how often) since it
// last looked. The zero value is ready to use.
type Counts struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one name.
func (c *Counts) Add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[name]++
}

// Get is how often name was counted since the last Take.
func (c *Counts) Get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// Take returns the counts since the last Take (never nil) and starts again from zero.
func (c *Counts) Take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	if n == nil {
		n = map[string]int{}
	}
	c.n = nil
	return n
}
