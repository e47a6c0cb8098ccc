package main

import (
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// The watcher sees an nft commit in its namespace, named after the committing process, and Close
// ends its receive loop.
func TestKernelGenWatcherSeesCommits(t *testing.T) {
	netns.RequireKernel(t, "nft")
	ns := netns.New(t, "nnm-nlgen")
	w, err := newGenWatcher(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	ns.MustExec("nft", "add", "table", "inet", "nnm_nlgen")
	select {
	case e := <-w.events:
		if e.overflow || e.proc != "nft" {
			t.Errorf("event %+v, want a commit by nft", e)
		}
	case <-time.After(5 * time.Second):
		t.Error("no commit seen")
	}
	w.Close()
}
