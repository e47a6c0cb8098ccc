// Package dataplane holds the project's strongest evidence: tests that reproduce the two problems the
// agent fixes with real packets between network namespaces, show the failure without the agent, and
// show it gone with the agent running each backend (iptables, nftables) in the "node" namespace.
//
//   - connection reset (invalid-drop, kubernetes#74839): reset_test.go, and beside kube-proxy
//     kubeproxy_test.go; the reproduction itself is internal/testing/resettest (the VM lane, e2e/vm, runs it too)
//   - External-IP unreachable from inside in IPVS mode (ipvs-externalip-dnat, kubernetes#75262):
//     externalip_test.go
//
// The tests need root, the agent binary (make build, or $NNM_AGENT_BIN), nft and conntrack, and for the
// External-IP test the control-plane binaries (make controlplane); they skip with the reason otherwise.
// Every address lives only in namespaces the tests create; nothing on the host is changed.
//
// Run: go test -count=1 -v ./dataplane/
package dataplane
