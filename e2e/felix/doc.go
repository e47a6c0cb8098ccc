// Package felix is the Felix lane (`make test-felix`, issue #20): the real Calico Felix and the agent
// on one node, for a while, and what must hold between them.
//
// Felix keeps its jumps (cali-INPUT, cali-FORWARD, …) first in the built-in chains (its default
// ChainInsertMode "insert") and, when another rule stands before them, logs "Detected out-of-sync
// inserts, marking for resync" and moves them back. An agent that does the same for its own jumps
// (the iptables backend did, before the rule-position policy of issue #20) fights it for ever: each
// side's resync undoes the other's, counted on our side in nnm_sync_repairs_total.
//
// Per Felix data plane (iptables with the nft variant; nftables when the Calico build has it) and
// per agent backend (iptables, nftables), in a node namespace of its own (the reset reproduction's
// topology, internal/testing/resettest) wired to one local API server (internal/testing/controlplane):
//
//  1. Calico's CRDs, ClusterInformation "default" (datastoreReady) and the Node; Felix starts (KDD,
//     internal/testing/felixtest) and programs its rules;
//  2. the agent starts with invalid-drop and ipvs-externalip-dnat (--proxy-mode ipvs, so the DNAT
//     fix runs; a dual-stack LoadBalancer Service with externalTrafficPolicy: Local gives it
//     entries), both families, --sync-period 2s;
//  3. the built-in chains' jump order (and the base chains of the nft tables) is taken after a
//     settling time and again after NNM_FELIX_DURATION (default 60s; 10m for the record);
//  4. then: nnm_sync_repairs_total is 0 per fix and family, Felix logged no "Detected out-of-sync"
//     warning since the agent started, both rule sets are present in both snapshots and the order
//     did not change, and the connection-reset reproduction (internal/testing/resettest) sends no RST with
//     Felix's chains in place, for both families.
//
// The lanes run in parallel (one Felix, one agent, three namespaces each). Run:
//
//	make test-felix                            # builds Felix once (hack/felix/build.sh), then this
//	NNM_FELIX_DURATION=10m make test-felix     # the record
//
// Without NNM_FELIX_ENV (set by make test-felix) the test skips: the lane is opt-in. With it, a
// missing build fails.
package felix
