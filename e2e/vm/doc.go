// Package vm is the VM lane: what needs a kernel this machine's does not have. The host kernel has
// no IP_VS, so kube-proxy's IPVS mode, and with it kubernetes#75262 and the ipvs-externalip-dnat fix,
// can only be shown for real in a virtual machine: Debian 12's 6.1 kernel (the package pinned in
// hack/vm/prepare.sh) booted by qemu under software emulation (TCG; no KVM needed), with the host's
// root file system shared read-only over virtio-9p, so the guest runs the very binaries the host
// built (the agent, bin/kube-proxy, iptables, nft, ipset, conntrack, ip) and this test binary itself.
//
// Lanes, and what each proves:
//   - dataplane/externalip_test.go (fast lane, host kernel, no VM): the fix's DNAT and masquerade
//     with an emulated IPVS (a veth named kube-ipvs0 and a Go forwarder in place of the IPVS
//     virtual server), both families, both backends, in about a second per case.
//   - e2e/vm (this package, the VM lane): the problems and the fixes with the real thing: kube-proxy
//     v1.37 in IPVS mode (kube-ipvs0 dummy, ipsets, IPVS virtual servers) on kernel 6.1, a node with
//     no local endpoint of an externalTrafficPolicy: Local LoadBalancer (TestGuestKubeProxyIPVS, run
//     in the guest by TestKubeProxyIPVSInVM):
//     external-ip: without the agent a host-network process cannot reach the External-IP
//     (kubernetes#75262); a pod can, since kube-proxy gives the virtual server the cluster's
//     endpoints when none is local (kubernetes#97081), and the test asserts both. With the agent
//     (iptables backend, then nftables) both reach it, on the Service's port only, and an
//     ipMode: Proxy Service is left alone.
//     connection-reset: kube-proxy's IPVS mode installs no INVALID drop, so the reset reproduction
//     of internal/testing/resettest (an out-of-window segment answered by the node's RST) happens beside
//     kube-proxy alone, and with the agent (each backend) the segment is dropped and the connection
//     lives on, counted by nnm_invalid_drop_dropped_packets_total.
//     follow/ipvs-to-nftables (#40): kube-proxy restarted from IPVS to nftables mode while the agent
//     runs (`backend: auto`): the External-IP DNAT is refused and removed within one syncPeriod,
//     invalid-drop moves to the nftables backend and is never missing from both (sampled every
//     100 ms), the agent is not restarted.
//     Both families in one run: a dual-stack Node, dual-stack Services and one address plan per
//     family (plans in host_test.go); the guest's IPv6 addresses exist only inside it.
//   - e2e/vm TestNodeTablesInVM (#61, a second boot, no kube-proxy): the node's two global tables,
//     which no network namespace can change: a conntrack table left 200 entries short of full and
//     2,048 peers on one flat /16 fail connections without the agent (conntrack drop, neighbour
//     table_fulls); the agent with conntrack-capacity and neighbour-table off puts
//     ConntrackTableFull and NeighbourTableFull on the Node (read from the guest through the
//     apiserver), a reload enabling them turns them False, the same loads then fail nothing, and
//     cleanup restores the kernel's values and removes the conditions (tables_test.go).
//   - dataplane/reset_test.go and dataplane/kubeproxy_test.go (host kernel): the same reset
//     reproduction on a bare node and beside kube-proxy's iptables and nftables modes.
//   - e2e/kubeproxy_test.go (host kernel): the agent beside a real kube-proxy in iptables and
//     nftables mode.
//
// Where the API server runs: on the host, as in every other e2e test (internal/testing/controlplane), not
// in the guest. Under emulation every guest instruction costs ~10-50 host ones; etcd and
// kube-apiserver would add a minute of startup and contend with kube-proxy and the agent for the
// two emulated CPUs. The guest reaches it through qemu's user-mode network with restrict=on (the
// guest can reach nothing on the host or beyond) and one guestfwd rule: connections to
// 10.0.2.100:6443 in the guest are piped by `busybox nc` to the apiserver's address in its test
// namespace. No tap device or host link is created, and the guest has no default route, so the
// test's External-IPs (TEST-NET-3) never leave it.
//
// Run: `make test-vm` (prepares the VM, then runs this package), or after hack/vm/prepare.sh:
//
//	go test -count=1 -v ./e2e/vm/
//
// Without root, qemu, the prepared kernel or the binaries the test skips naming what is missing;
// under CI=true or NNM_REQUIRE_KERNEL=1 it fails instead.
package vm
