// Package cluster is the cluster lane (make test-cluster, issue #38): a Kubernetes cluster of real
// nodes without Docker, the agent installed as docs/deploy.md says, and the fixes proven with real
// Pods, once per kube-proxy mode (IPVS, nftables).
//
//	root netns            control-plane netns (internal/testing/controlplane, Options.Controllers)
//	+-----------+         +-------------------------------------------------------------+
//	| test,     |--veth-->| etcd, kube-apiserver, kube-controller-manager, scheduler    |
//	| kubectl   |         | bridge nnmbr0 192.168.100.1/24 (the apiserver's address)    |
//	+-----------+         +----+---------------------------+----------------------------+
//	                        tap-node-a                  tap-node-b
//	                  +--------+---------+        +--------+---------+
//	                  | qemu TCG guest   |        | qemu TCG guest   |
//	                  | node-a .11       |        | node-b .12       |
//	                  | pods 10.244.1/24 |        | pods 10.244.2/24 |
//	                  +------------------+        +------------------+
//
// Each node is the VM lane's guest (hack/vm/prepare.sh: the pinned Debian 6.1 kernel, this machine's
// root shared read-only over 9p, hack/vm/init.sh) running hack/cluster/node.sh: cgroup v2, Debian's
// containerd 1.6 and runc, the CNI reference plugins (bridge, host-local, portmap) with routes to the
// other node's pod CIDR, kubelet and kube-proxy from the pinned k8s.io/kubernetes (tools/cluster,
// tools/kube-apiserver). The images (the agent's from `make image`, a pause image and the test
// workload, e2e/cluster/workload) are imported into each node's containerd from tarballs
// (hack/cluster/images.sh): no registry.
//
// The kubelet of 1.37 still accepts containerd 1.6, which lacks the CRI RuntimeConfig call: it logs
// "CRI implementation should be updated to support RuntimeConfig. Falling back to using cgroupDriver
// from kubelet config." and sets kubelet_cri_losing_support{version="1.38.0"} (cmd/kubelet/app/server.go,
// getCgroupDriverFromCRI; 1.36 named 1.37.0 there): 1.38 is the release that will need containerd 2.
//
// Missing prerequisites skip the lane on a developer's machine and fail it under CI
// (core/testkit/netns); `make test-cluster` prepares everything and sets NNM_REQUIRE_KERNEL=1.
package cluster
