#!/usr/bin/env bash
# make release: the image network-node-manager:$VERSION for linux/amd64 and linux/arm64, without a
# Docker engine, as one manifest list in buildah's local storage (hack/image.sh builds each
# architecture as network-node-manager:$VERSION-$ARCH). Then it shows what was built: the manifest
# list's platforms, the file types of the agent, iptables and nft in each image, and each image's
# agent printing `version` (arm64 under qemu-user).
#
#   make release                          VERSION from hack/version.sh --release: CHANGELOG.md's latest
#                                         release, the tag deploy/components/release runs
#   buildah manifest push --all network-node-manager:$VERSION docker://REGISTRY/network-node-manager:$VERSION
#
# Environment: VERSION, COMMIT (as hack/image.sh; a release VERSION needs a clean tree), ARCHES
# (default "amd64 arm64"; ARCHES=amd64 for one).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VERSION="${VERSION:-$("$ROOT/hack/version.sh" --release)}"
export COMMIT="${COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || true)}"
ARCHES="${ARCHES:-amd64 arm64}"
IMAGE=network-node-manager
LIST="$IMAGE:$VERSION"

for arch in $ARCHES; do
	echo "== linux/$arch"
	ARCH="$arch" TAG="$VERSION-$arch" "$ROOT/hack/image.sh"
done

buildah manifest rm "$LIST" >/dev/null 2>&1 || buildah rmi "$LIST" >/dev/null 2>&1 || true
buildah manifest create "$LIST" >/dev/null
for arch in $ARCHES; do
	buildah manifest add --os linux --arch "$arch" "$LIST" "containers-storage:localhost/$IMAGE:$VERSION-$arch" >/dev/null
done

echo "== manifest list $LIST"
buildah manifest inspect "$LIST" | python3 -c '
import json, sys
for m in json.load(sys.stdin)["manifests"]:
    p = m["platform"]
    print("  %s/%s  %s  %d bytes" % (p["os"], p["architecture"], m["digest"], m["size"]))'

for arch in $ARCHES; do
	echo "== contents of $IMAGE:$VERSION-$arch"
	ctr="$(buildah from --pull-never "$IMAGE:$VERSION-$arch")"
	mnt="$(buildah mount "$ctr")"
	(cd "$mnt" && file -L usr/local/bin/network-node-manager usr/sbin/xtables-nft-multi usr/sbin/xtables-legacy-multi usr/sbin/nft) |
		sed -E 's/, (BuildID|stripped|for GNU).*//; s/^/  /'
	buildah inspect --type image --format '{{range $k, $v := .OCIv1.Config.Labels}}  {{$k}}={{$v}}{{"\n"}}{{end}}' "$IMAGE:$VERSION-$arch"
	if [[ "$arch" == "$(dpkg --print-architecture)" ]]; then
		"$mnt/usr/local/bin/network-node-manager" version | sed -n '1,3p;/^backends/p' | sed 's/^/  /'
	else
		q="qemu-$( [[ $arch == arm64 ]] && echo aarch64 || echo "$arch")-static"
		echo "  \$ $q $IMAGE:$VERSION-$arch:/usr/local/bin/network-node-manager version"
		"$q" -L "$mnt" "$mnt/usr/local/bin/network-node-manager" version | sed -n '1,3p;/^backends/p' | sed 's/^/  /'
		echo "  \$ $q -L <image> <image>/usr/sbin/iptables-nft-save --version"
		"$q" -L "$mnt" "$mnt/usr/sbin/iptables-nft-save" --version | sed 's/^/  /'
		echo "  \$ $q -L <image> <image's ld-linux> --list <image>/usr/sbin/nft   (nft's libraries, resolved in the image)"
		"$q" -L "$mnt" "$(ls "$mnt"/usr/lib/ld-linux-*.so.1 | head -n1)" --list "$mnt/usr/sbin/nft" | sed "s#$mnt##; s/^/  /"
	fi
	buildah umount "$ctr" >/dev/null
	buildah rm "$ctr" >/dev/null
done
