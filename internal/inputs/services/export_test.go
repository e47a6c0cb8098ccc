package services

import "github.com/network-node-manager/network-node-manager/core/fix"

// Hooks for the external tests (memory_test.go): the informer transform and the sorted list.
var Transform = transform

// NewSorted returns the set and list of a new sortedServices.
func NewSorted() (set func(obj any, deleted bool), list func() []*fix.Service) {
	s := &sortedServices{}
	return s.set, s.list
}
