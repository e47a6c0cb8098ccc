#!/usr/bin/env bash
# Builds the container image network-node-manager:$VERSION (and :latest) without a Docker engine, into
# buildah's local storage, with the same content as the Dockerfile:
#   - the agent, built static here as the Dockerfile's build stage does (same flags), at
#     /usr/local/bin/network-node-manager;
#   - a Debian bookworm base with iptables and nftables, made with debootstrap (--variant=minbase, the
#     content of debian:bookworm-slim, plus --include=iptables,nftables as the Dockerfile's apt-get
#     install). No registry is reachable here, so the base cannot be pulled: debootstrap builds it from
#     the Debian archive the host's apt uses. Assembling it from the host's own installed packages
#     would tie the image to whatever this machine has; debootstrap gives the release the Dockerfile
#     names, reproducibly.
#   - ENTRYPOINT, CMD, USER, EXPOSE as in the Dockerfile.
#
# The debootstrapped base is cached as bin/image-base.tar, keyed by a hash of this script (suite,
# mirror, packages); rebuilding the image after a code change takes seconds.
#
# Environment:
#   VERSION          image tag and main.version (default: hack/version.sh)
#   COMMIT           main.commit (default: git rev-parse --short=12 HEAD)
#   NNM_BIN_DIR      cache and binary directory (default <repo>/bin)
#   DEBIAN_MIRROR    default http://deb.debian.org/debian
#   IMAGE_EXPORT=DIR also copy the image's root filesystem to DIR (for tests)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${NNM_BIN_DIR:-$ROOT/bin}"
VERSION="${VERSION:-$("$ROOT/hack/version.sh")}"
COMMIT="${COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || true)}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=iptables,nftables
IMAGE=network-node-manager
BASE="$BIN/image-base.tar"
STAMP="$BIN/.image-base-stamp"

for tool in buildah debootstrap; do
	command -v "$tool" >/dev/null || { echo "$tool is missing: make image-deps (apt-get install buildah debootstrap)" >&2; exit 1; }
done
[[ "$(id -u)" == 0 ]] || { echo "hack/image.sh needs root (debootstrap, buildah's storage)" >&2; exit 1; }
mkdir -p "$BIN"

base_hash() { { sha256sum "$ROOT/hack/image.sh"; echo "$SUITE $MIRROR $PACKAGES"; } | sha256sum | cut -d' ' -f1; }

# base: bookworm minbase + iptables + nftables, as a tarball of its root filesystem.
base() {
	local want
	want="$(base_hash)"
	if [[ -f "$BASE" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
		echo "base $SUITE ($PACKAGES) cached in $BASE"
		return
	fi
	local dir
	dir="$(mktemp -d "$BIN/.image-base.XXXXXX")"
	echo "debootstrap $SUITE ($PACKAGES) from $MIRROR"
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$dir/rootfs" "$MIRROR" >"$dir/debootstrap.log" 2>&1 ||
		{ tail -20 "$dir/debootstrap.log" >&2; exit 1; }
	# What debian:*-slim drops: package lists, caches, docs; and the check the Dockerfile runs.
	chroot "$dir/rootfs" sh -c 'iptables-nft-save --version && iptables-legacy-save --version && nft --version'
	rm -rf "$dir/rootfs"/var/lib/apt/lists/* "$dir/rootfs"/var/cache/apt/*.bin "$dir/rootfs"/var/cache/apt/archives/*.deb \
		"$dir/rootfs"/usr/share/doc/* "$dir/rootfs"/usr/share/man/* "$dir/rootfs"/usr/share/info/* "$dir/rootfs"/var/log/*.log
	tar -C "$dir/rootfs" --numeric-owner -cf "$BASE.tmp" .
	mv -f "$BASE.tmp" "$BASE"
	rm -rf "$dir"
	echo "$want" >"$STAMP"
}

agent() {
	echo "building the agent $VERSION"
	(cd "$ROOT" && CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$BIN/.image-agent" ./cmd/network-node-manager)
	"$BIN/.image-agent" version >/dev/null
}

main() {
	base
	agent
	local ctr mnt
	ctr="$(buildah from scratch)"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	mnt="$(buildah mount "$ctr")"
	tar -C "$mnt" --numeric-owner -xf "$BASE"
	install -D -m 0755 "$BIN/.image-agent" "$mnt/usr/local/bin/network-node-manager"
	if [[ -n "${IMAGE_EXPORT:-}" ]]; then
		rm -rf "$IMAGE_EXPORT" && mkdir -p "$IMAGE_EXPORT" && cp -a "$mnt/." "$IMAGE_EXPORT/"
	fi
	buildah umount "$ctr" >/dev/null
	buildah config --user 0:0 --port 9484 --port 9485 --entrypoint '["/usr/local/bin/network-node-manager"]' --cmd run \
		--label org.opencontainers.image.version="$VERSION" --label org.opencontainers.image.source=network-node-manager \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
	buildah commit --quiet --rm "$ctr" "$IMAGE:$VERSION" >/dev/null
	trap - EXIT
	buildah tag "$IMAGE:$VERSION" "$IMAGE:latest"
	buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE:$VERSION"
}

main "$@"
