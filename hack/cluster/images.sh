#!/usr/bin/env bash
# Exports the cluster lane's own images (make test-cluster) as docker-archive tarballs that each
# node's containerd imports at boot (`ctr -n k8s.io images import`). The agent's image is not among
# them: docs/deploy.md's install steps build its release bundle and push it to the lane's registry,
# from which the kubelets pull it (e2e/cluster/release_test.go).
#   pause.tar     localhost/nnm-cluster-pause:$TAG, the Pod sandbox image (containerd's sandbox_image)
#   workload.tar  localhost/nnm-cluster-workload:$TAG, the test Pods' server and client
# pause and workload are the one static binary e2e/cluster/workload (`workload pause`, `workload
# serve`, ...) in an image built from scratch with buildah. Output, in $BIN/cluster-images:
# the tarballs and images.env (the references, read by e2e/cluster), and the rule sampler
# (e2e/cluster/sampler), which the nodes run from this machine's root.
#
# Environment: NNM_BIN_DIR.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" # NNM_ROOT, BIN

OUT="$BIN/cluster-images"
# The workload's tag is a hash of its source: a changed binary is a new image on the nodes.
TAG="$(cat "$NNM_ROOT"/e2e/cluster/workload/*.go | sha256sum | cut -c1-12)"
PAUSE="localhost/nnm-cluster-pause:$TAG"
WORKLOAD="localhost/nnm-cluster-workload:$TAG"

[[ "$(id -u)" == 0 ]] || { echo "hack/cluster/images.sh needs root (buildah's storage)" >&2; exit 1; }
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

(cd "$NNM_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$tmp/workload" ./e2e/cluster/workload)
(cd "$NNM_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$OUT/sampler" ./e2e/cluster/sampler)

# scratch_image REF ARGS...: REF holds /workload with the entrypoint "/workload ARGS...".
scratch_image() {
	local ref="$1" ctr mnt entry
	shift
	ctr="$(buildah from scratch)"
	mnt="$(buildah mount "$ctr")"
	install -m 0755 "$tmp/workload" "$mnt/workload"
	buildah umount "$ctr" >/dev/null
	entry="$(printf '"%s",' /workload "$@")"
	buildah config --entrypoint "[${entry%,}]" --cmd '' "$ctr"
	buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
}
scratch_image "$PAUSE" pause
scratch_image "$WORKLOAD"

# export REF FILE: a docker-archive that names REF, so `ctr images import` registers that name.
export_image() {
	rm -f "$OUT/$2"
	buildah push --quiet "$1" "docker-archive:$OUT/$2:$1" >/dev/null
}
export_image "$PAUSE" pause.tar
export_image "$WORKLOAD" workload.tar
cat >"$OUT/images.env" <<ENV
NNM_CLUSTER_PAUSE_IMAGE=$PAUSE
NNM_CLUSTER_WORKLOAD_IMAGE=$WORKLOAD
ENV
ls -lh "$OUT"
