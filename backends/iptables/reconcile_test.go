package iptables

import (
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/testkit"
)

// The tests reconcile through these: apply as a change-triggered sync (Trust), verify and inSync as
// the periodic resync (Verify).
var (
	apply  = testkit.Change
	remove = testkit.Remove
	verify = testkit.Verify
	inSync = testkit.InSync
)

// opsOf returns the operations under the backend's Driver.
func opsOf(b *Backend) *Ops {
	o, _ := backend.As[*Ops](b)
	return o
}
