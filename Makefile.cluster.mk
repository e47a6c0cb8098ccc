# The cluster lane (issue #38): a two-node Kubernetes cluster of qemu guests without Docker, the agent
# installed as docs/deploy.md says, the fixes proven with real Pods (e2e/cluster). Included by the
# Makefile.
#
#   make test-cluster              both kube-proxy modes (IPVS, nftables), one cluster each
#   NNM_CLUSTER_MODES=ipvs make test-cluster
#   NNM_CLUSTER_DAY2=ipvs make test-cluster  also day 2 in the IPVS cluster's boot after its proofs
#                                  (e2e/cluster/day2_test.go: mss-clamp with a Pod, rolling upgrade
#                                  sampled every 100 ms, bad ConfigMap, scrape, Node Events, 10,000
#                                  Services, probes, uninstall); all: both modes; 0: none
#
# The intended default is day 2 in IPVS mode only (that cluster carries the agent's heaviest load:
# the iptables-nft backend, ipvs-externalip-dnat over 10,000 External-IPs; nftables mode's day 2
# differs in the backend only, which make test's e2e suite runs on a real kernel; it adds about 15
# minutes). It stays opt-in because its 10,000-Service stage does not pass every time under
# emulation: it passed at bb81227 (no OOM kill, no restart, every agent covering the Services 2m38s
# after the last create), and at 6f926a6 the kubelet restarted one agent whose /livez did not answer
# within the probe's 3 s three times while the node's one emulated CPU ran the agent's restores and
# read-backs (a list took about 8 s there, an iptables-save of the node about 100 s).
NNM_CLUSTER_DAY2 ?= 0

# What the nodes run from this machine's root (shared read-only into the guests), as
# "probe:debian-package": containerd 1.6 (kubelet 1.36 accepts it: e2e/cluster/doc.go), runc, the
# CNI reference plugins.
CLUSTER_DEPS := containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins
CLUSTER_TEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: cluster test-cluster

## cluster: everything the cluster lane needs: the packages, the VM lane's kernel and initramfs
## (a failure here fails, unlike `make vm`), kubelet, kube-controller-manager, kube-scheduler and
## kubectl (hack/cluster/build.sh), the pause and workload images (hack/cluster/images.sh). The
## agent's image is built by docs/deploy.md's install steps themselves (make release, in the test);
## one release build here first (linux/amd64, the nodes' architecture) makes that run a cache hit of
## seconds instead of a debootstrap while the nodes wait.
cluster: build controlplane image-deps
	@$(MAKE) --no-print-directory deps SYSTEM_DEPS="$(CLUSTER_DEPS)"
	./hack/vm/prepare.sh >/dev/null
	./hack/cluster/build.sh
	./hack/cluster/images.sh
	ARCHES=amd64 $(MAKE) --no-print-directory release >/dev/null

## test-cluster: the cluster lane; prints how long it took. Fails (never skips) when a part cannot start.
test-cluster: cluster
	@start=$$(date +%s); rc=0; \
		NNM_CLUSTER=1 NNM_CLUSTER_DAY2=$(NNM_CLUSTER_DAY2) NNM_REQUIRE_KERNEL=1 NNM_AGENT_BIN=$(AGENT) $(GO) test $(CLUSTER_TEST_FLAGS) -v ./e2e/cluster/ || rc=$$?; \
		echo "make test-cluster: the lane's tests took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
