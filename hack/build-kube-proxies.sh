#!/usr/bin/env bash
# Builds the kube-proxy of every older supported Kubernetes release for the version matrix
# (make test-kube-versions), one tools module each (tools/kube-proxy-v1.<minor>, k8s.io/kubernetes
# pinned in its go.mod/go.sum), into bin/kube-proxy-<release> (e.g. bin/kube-proxy-v1.35.4). The
# newest release's kube-proxy is bin/kube-proxy itself (hack/build-controlplane.sh, tools/kube-apiserver).
# Rebuilt only when those modules, this script or the Go version change (bin/.kube-proxies-stamp).
#
#   hack/build-kube-proxies.sh          build; prints nothing else on stdout
#   hack/build-kube-proxies.sh --list   print "<release> <path>" of every kube-proxy of the matrix,
#                                       the project's own pin (bin/kube-proxy) last
#
# Environment: NNM_BIN_DIR, FORCE=1.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # NNM_ROOT, BIN

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"
MODS=("$NNM_ROOT"/tools/kube-proxy-v1.*)

release() { (cd "$1" && go list -m -f '{{.Version}}' k8s.io/kubernetes); }

if [[ ${1:-} == --list ]]; then
	for d in "${MODS[@]}"; do
		v="$(release "$d")"
		echo "$v $BIN/kube-proxy-$v"
	done
	echo "$(release "$NNM_ROOT/tools/kube-apiserver") $BIN/kube-proxy"
	exit 0
fi

outs=()
for d in "${MODS[@]}"; do
	outs+=("$BIN/kube-proxy-$(release "$d")")
done

build() {
	local d v
	for d in "${MODS[@]}"; do
		v="$(release "$d")"
		nnm_go_build "$d" k8s.io/kubernetes k8s.io/kubernetes/cmd/kube-proxy "kube-proxy-$v" "$(nnm_kube_version_ldflags "$d")"
	done
}

nnm_stamped_build kube-proxies "$(nnm_inputs_hash hack/build-kube-proxies.sh "${MODS[@]#"$NNM_ROOT"/}")" build "${outs[@]}" >&2
