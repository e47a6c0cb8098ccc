# The cluster lane (issue #38): a two-node Kubernetes cluster of qemu guests without Docker, the agent
# installed as docs/deploy.md says, the fixes proven with real Pods (e2e/cluster). Included by the
# Makefile.
#
#   make test-cluster              both kube-proxy modes (IPVS, nftables), one cluster each, and day 2
#                                  in the IPVS cluster's boot after its proofs
#                                  (e2e/cluster/day2_test.go: mss-clamp with a Pod, rolling upgrade
#                                  sampled every 100 ms, bad ConfigMap, scrape, Node Events, 10,000
#                                  Services, probes, uninstall)
#   NNM_CLUSTER_MODES=ipvs make test-cluster
#   NNM_CLUSTER_DAY2=0 make test-cluster     without day 2; all: day 2 in both modes
#
# Day 2 runs in IPVS mode only: that cluster carries the agent's heaviest load (the iptables-nft
# backend, ipvs-externalip-dnat over 10,000 External-IPs); nftables mode's day 2 differs in the
# backend only, which make test's e2e suite runs on a real kernel. It adds 14-17 minutes (822 s and
# 1,000 s in two runs; .ci/run took 2,324 s in all with it). Its 10,000-Service stage under
# emulation is what the DaemonSet's liveness probe was set from: with a timeout of 3 s the kubelet
# once restarted an agent whose starved HTTP server answered late; with 10 s and 6 failures no
# agent restarted (one liveness probe in two runs still failed; the readiness probe, 3 s, times
# out now and then under that load, which restarts nothing; the lane logs the failures by kind).
NNM_CLUSTER_DAY2 ?= ipvs

# What the nodes run from this machine's root (shared read-only into the guests), as
# "probe:debian-package": containerd 1.6 (kubelet 1.37 accepts it: e2e/cluster/doc.go), runc, the
# CNI reference plugins.
CLUSTER_DEPS := containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins
CLUSTER_TEST_FLAGS ?= -count=1 -timeout 60m

.PHONY: cluster test-cluster

## cluster: everything the cluster lane needs: the packages, the VM lane's kernel and initramfs
## (a failure here fails, unlike `make vm`), kubelet, kube-controller-manager, kube-scheduler and
## kubectl (hack/cluster/build.sh), the release tools (cosign, helm, the registry, syft), the pause
## and workload images (hack/cluster/images.sh) and the previous release's bundle
## (hack/cluster/previous-release.sh), which the lane installs and upgrades from. This commit's
## bundle is built by docs/deploy.md's install steps themselves (make release, in the test); one
## release build here first (linux/amd64, the nodes' architecture) makes that run a cache hit of
## seconds instead of a debootstrap while the nodes wait.
cluster: build controlplane image-deps release-tools
	@$(MAKE) --no-print-directory deps SYSTEM_DEPS="$(CLUSTER_DEPS)"
	./hack/vm/prepare.sh >/dev/null
	./hack/cluster/build.sh
	./hack/cluster/images.sh
	./hack/cluster/previous-release.sh
	ARCHES=amd64 $(MAKE) --no-print-directory release >/dev/null

## test-cluster: the cluster lane; prints how long it took. Fails (never skips) when a part cannot start.
test-cluster: cluster
	@start=$$(date +%s); rc=0; \
		NNM_CLUSTER=1 NNM_CLUSTER_DAY2=$(NNM_CLUSTER_DAY2) NNM_REQUIRE_KERNEL=1 NNM_AGENT_BIN=$(AGENT) $(GO) test $(CLUSTER_TEST_FLAGS) -v ./e2e/cluster/ || rc=$$?; \
		echo "make test-cluster: the lane's tests took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
