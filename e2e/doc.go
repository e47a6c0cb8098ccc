// Package e2e holds the end-to-end scenarios: the real agent binary runs with the ServiceAccount and
// RBAC of deploy/base in a "node" network namespace against a real kube-apiserver and etcd
// (internal/testing/controlplane), and each scenario asserts on the kernel's ruleset (iptables-save, nft list)
// and on the agent's /metrics.
//
// Run them as root after `make build controlplane`:
//
//	go test -count=1 ./e2e/...
//	go test -count=1 -run 'TestScenarios/nftables/8' -v ./e2e/
//
// They skip with a message naming what is missing when not root or when bin/network-node-manager,
// bin/etcd or bin/kube-apiserver are absent. One control plane per backend is shared by that backend's
// scenarios, which run one after the other (every agent watches every Service, and scenario 8 stops
// the apiserver); the two backends run in parallel.
package e2e
