#!/usr/bin/env bash
# Builds the Kubernetes binaries of the cluster lane (make test-cluster) that the control plane build
# (hack/build-controlplane.sh: etcd, kube-apiserver, kube-proxy) does not make, from tools/cluster
# (k8s.io/kubernetes pinned in go.mod/go.sum, the same release as tools/kube-apiserver):
#   bin/kubelet, bin/kube-controller-manager, bin/kube-scheduler, bin/kubectl
# Rebuilt only when tools/cluster, this script or the Go version change (bin/.cluster-stamp); the
# control plane's stamp is not affected. FORCE=1 rebuilds anyway.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" # NNM_ROOT, BIN

DIR="$NNM_ROOT/tools/cluster"
# The control plane's build environment: packages shared with kube-apiserver come from the build cache.
export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
CMDS=(kubelet kube-controller-manager kube-scheduler kubectl)

build() {
	local ld c
	ld="$(nnm_kube_version_ldflags "$DIR")"
	for c in "${CMDS[@]}"; do
		nnm_go_build "$DIR" k8s.io/kubernetes "k8s.io/kubernetes/cmd/$c" "$c" "$ld"
	done
}

nnm_stamped_build cluster "$(nnm_inputs_hash hack/cluster/build.sh tools/cluster)" build "${CMDS[@]/#/$BIN/}"
