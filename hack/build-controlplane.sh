#!/usr/bin/env bash
# Builds the local Kubernetes control plane used by tests and `make demo`:
#   bin/kube-apiserver  from tools/kube-apiserver (k8s.io/kubernetes, pinned in go.mod/go.sum)
#   bin/etcd            from tools/etcd           (go.etcd.io/etcd/server/v3, pinned in go.mod/go.sum)
#   bin/kube-proxy      from tools/kube-apiserver (the same k8s.io/kubernetes pin; the e2e
#                       tests with a real kube-proxy and the VM lane run it)
#
# The binaries are rebuilt only when the pinned inputs change: a hash of the
# tools modules' go.mod/go.sum/*.go files, this script and the Go version is
# kept in bin/.controlplane-stamp.
#
# Environment:
#   NNM_BIN_DIR  output directory (default: <repo>/bin)
#   FORCE=1      rebuild even if the stamp matches
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # sets NNM_ROOT and BIN

TOOLS="$NNM_ROOT/tools"

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

build() {
	local ld
	ld="$(nnm_kube_version_ldflags "$TOOLS/kube-apiserver")" # the pinned release in /version (hack/lib.sh)
	nnm_go_build "$TOOLS/etcd" go.etcd.io/etcd/server/v3 ./cmd/etcd etcd
	nnm_go_build "$TOOLS/kube-apiserver" k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver "$ld"
	nnm_go_build "$TOOLS/kube-apiserver" k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-proxy kube-proxy "$ld"
}

nnm_stamped_build controlplane "$(nnm_inputs_hash hack/build-controlplane.sh tools/kube-apiserver tools/etcd)" build \
	"$BIN/etcd" "$BIN/kube-apiserver" "$BIN/kube-proxy"
