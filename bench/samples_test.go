package main

import (
	"strings"
	"testing"
	"time"
)

// TestLatencySamples: every latency of every result, in the order measured, with its run, backend,
// kind and index.
func TestLatencySamples(t *testing.T) {
	rs := []*result{
		{run: 1, backend: "iptables", latency: map[string][]time.Duration{"create": {30 * time.Millisecond, 45500 * time.Microsecond}, "delete": {29 * time.Millisecond}}},
		{run: 2, backend: "nftables", latency: map[string][]time.Duration{"update": {12 * time.Millisecond}}},
	}
	want := "# run backend kind index ms\n1 iptables create 0 30.0\n1 iptables create 1 45.5\n1 iptables delete 0 29.0\n2 nftables update 0 12.0\n"
	if got := latencySamples(rs); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, strings.TrimSpace(want))
	}
}
