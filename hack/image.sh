#!/usr/bin/env bash
# Builds the container image network-node-manager:$TAG for one architecture without a Docker engine,
# into buildah's local storage, with the same content as the Dockerfile:
#   - the agent, built static here as the Dockerfile's build stage does (same flags, GOARCH=$ARCH), at
#     /usr/local/bin/network-node-manager;
#   - a Debian bookworm base of $ARCH with iptables and nftables, made with debootstrap
#     (--variant=minbase, the content of debian:bookworm-slim, plus --include=iptables,nftables as the
#     Dockerfile's apt-get install). No registry is reachable here, so the base cannot be pulled:
#     debootstrap builds it from the Debian archive the host's apt uses.
#       * The build machine's architecture: a full debootstrap (packages unpacked and configured).
#       * Another architecture (arm64 on an amd64 machine): debootstrap --foreign downloads that
#         architecture's packages and this script unpacks them all; their configuration step (maintainer scripts) would have to run
#         arm64 code through a binfmt_misc registration, a change of the host kernel's state this
#         script does not make. What it leaves out: the `iptables` alternative symlink and the
#         ld.so cache. The agent calls the variant binaries (iptables-nft-save, iptables-legacy-…,
#         nft) that the packages ship as files, and glibc finds the multiarch libraries without the
#         cache; the script checks both by running the image's iptables-nft-save and
#         iptables-legacy-save under qemu-user (qemu-user-static, invoked directly, no binfmt) against
#         the image's own libraries, and by having the image's loader resolve nft's libraries (nft
#         itself needs a netfilter netlink socket, which qemu-user does not emulate).
#   - ENTRYPOINT, CMD, USER, EXPOSE as in the Dockerfile; OCI labels (version, revision, created,
#     source, licenses, title).
#
# The debootstrapped base is cached as bin/image-base-$ARCH.tar, keyed by a hash of this script
# (suite, mirror, packages), the downloaded packages in bin/debootstrap-cache-$ARCH; rebuilding the
# image after a code change takes seconds.
#
# Environment:
#   VERSION          main.version and the default tag (default: hack/version.sh, a pre-release of
#                    this commit; RELEASE=1: hack/version.sh --release, the manifests' tag). A release
#                    version (vX.Y.Z, no pre-release part) names a commit: it is refused from a tree
#                    with uncommitted changes (NNM_ALLOW_DIRTY_RELEASE=1 overrides, for tests only)
#   COMMIT           main.commit (default: git rev-parse --short=12 HEAD)
#   ARCH             Debian/Go architecture: amd64, arm64 (default: the build machine's)
#   TAG              image tag (default: $VERSION, plus :latest for the build machine's architecture)
#   NNM_BIN_DIR      cache and binary directory (default <repo>/bin)
#   DEBIAN_MIRROR    default http://deb.debian.org/debian
#   IMAGE_EXPORT=DIR also copy the image's root filesystem to DIR (for tests)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${NNM_BIN_DIR:-$ROOT/bin}"
if [[ "${RELEASE:-}" == 1 ]]; then
	VERSION="${VERSION:-$("$ROOT/hack/version.sh" --release)}"
else
	VERSION="${VERSION:-$("$ROOT/hack/version.sh")}"
fi
# A release tag must be the image of a commit, the same bytes whoever builds it.
if [[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ && "${NNM_ALLOW_DIRTY_RELEASE:-}" != 1 ]] &&
	! git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null; then
	echo "hack/image.sh: $VERSION is a release tag, and this tree has uncommitted changes: commit them, or build a pre-release (make image without RELEASE=1)" >&2
	exit 1
fi
COMMIT="${COMMIT:-$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || true)}"
HOST_ARCH="$(dpkg --print-architecture)"
ARCH="${ARCH:-$HOST_ARCH}"
TAG="${TAG:-$VERSION}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=iptables,nftables
IMAGE=network-node-manager
BASE="$BIN/image-base-$ARCH.tar"
STAMP="$BIN/.image-base-$ARCH-stamp"

# qemu-user's name for a Debian architecture.
qemu_arch() { case "$1" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; *) echo "$1" ;; esac; }
# run_arch ROOTFS PROGRAM ARGS…: runs an $ARCH program of ROOTFS here, natively or under qemu-user
# with ROOTFS as its library root.
run_arch() {
	local rootfs="$1"; shift
	if [[ "$ARCH" == "$HOST_ARCH" ]]; then
		"$@"
	else
		"qemu-$(qemu_arch "$ARCH")-static" -L "$rootfs" "$@"
	fi
}

tools=(buildah debootstrap)
[[ "$ARCH" == "$HOST_ARCH" ]] || tools+=("qemu-$(qemu_arch "$ARCH")-static")
for tool in "${tools[@]}"; do
	command -v "$tool" >/dev/null || { echo "$tool is missing: make image-deps (apt-get install buildah debootstrap qemu-user-static)" >&2; exit 1; }
done
[[ "$(id -u)" == 0 ]] || { echo "hack/image.sh needs root (debootstrap, buildah's storage)" >&2; exit 1; }
mkdir -p "$BIN"

base_hash() { { sha256sum "$ROOT/hack/image.sh"; echo "$SUITE $MIRROR $PACKAGES $ARCH"; } | sha256sum | cut -d' ' -f1; }

# base: bookworm minbase + iptables + nftables of $ARCH, as a tarball of its root filesystem.
base() {
	local want
	want="$(base_hash)"
	if [[ -f "$BASE" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
		echo "base $SUITE/$ARCH ($PACKAGES) cached in $BASE"
		return
	fi
	local dir foreign=() cache="$BIN/debootstrap-cache-$ARCH"
	dir="$(mktemp -d "$BIN/.image-base.XXXXXX")"
	mkdir -p "$cache"
	[[ "$ARCH" == "$HOST_ARCH" ]] || foreign=(--foreign)
	echo "debootstrap $SUITE/$ARCH ${foreign[*]} ($PACKAGES) from $MIRROR"
	debootstrap "${foreign[@]}" --cache-dir="$cache" --arch="$ARCH" --variant=minbase --include="$PACKAGES" "$SUITE" "$dir/rootfs" "$MIRROR" >"$dir/debootstrap.log" 2>&1 ||
		{ tail -20 "$dir/debootstrap.log" >&2; exit 1; }
	local r="$dir/rootfs"
	if [[ ${#foreign[@]} -gt 0 ]]; then
		# Stage one unpacked only the required packages; unpack every downloaded one (iptables,
		# nftables and their libraries) the way debootstrap does, keeping merged-/usr's symlinks.
		local deb
		for deb in $(cat "$r/debootstrap/debpaths" | cut -d' ' -f2); do
			dpkg-deb --fsys-tarfile "$r$deb" | tar -C "$r" --keep-directory-symlink -xf -
		done
	fi
	# The debs a --foreign stage keeps for its second stage are not part of the image.
	rm -rf "$r/debootstrap"
	# What debian:*-slim drops: package lists, caches, docs; and the check the Dockerfile runs.
	if [[ "$ARCH" == "$HOST_ARCH" ]]; then
		chroot "$r" sh -c 'iptables-nft-save --version && iptables-legacy-save --version && nft --version'
	else
		for tool in iptables-nft-save iptables-legacy-save; do
			# xtables-*-multi picks its personality from argv[0]; qemu passes the path through.
			run_arch "$r" "$r/usr/sbin/$tool" --version
		done
		# nft opens a netfilter netlink socket even for --version, which qemu-user does not emulate
		# ("Protocol not supported"): have the image's dynamic loader resolve nft's libraries instead.
		run_arch "$r" "$(ls "$r"/usr/lib/ld-linux-*.so.1 | head -n1)" --list "$r/usr/sbin/nft"
	fi
	rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/cache/apt/archives/*.deb \
		"$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/var/log/*.log
	tar -C "$r" --numeric-owner -cf "$BASE.tmp" .
	mv -f "$BASE.tmp" "$BASE"
	rm -rf "$dir"
	echo "$want" >"$STAMP"
}

agent() {
	echo "building the agent $VERSION for linux/$ARCH"
	(cd "$ROOT" && CGO_ENABLED=0 GOOS=linux GOARCH="$ARCH" go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$BIN/.image-agent-$ARCH" ./cmd/network-node-manager)
}

main() {
	base
	agent
	local ctr mnt
	ctr="$(buildah from scratch)"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	mnt="$(buildah mount "$ctr")"
	tar -C "$mnt" --numeric-owner -xf "$BASE"
	install -D -m 0755 "$BIN/.image-agent-$ARCH" "$mnt/usr/local/bin/network-node-manager"
	install -D -m 0644 "$ROOT/deploy/image/connlabel.conf" "$mnt/etc/xtables/connlabel.conf"
	# The image's agent runs (natively or under qemu-user) and says what it is.
	run_arch "$mnt" "$mnt/usr/local/bin/network-node-manager" version | sed -n '1,3p'
	if [[ -n "${IMAGE_EXPORT:-}" ]]; then
		rm -rf "$IMAGE_EXPORT" && mkdir -p "$IMAGE_EXPORT" && cp -a "$mnt/." "$IMAGE_EXPORT/"
	fi
	buildah umount "$ctr" >/dev/null
	buildah config --user 0:0 --port 9484 --port 9485 --entrypoint '["/usr/local/bin/network-node-manager"]' --cmd run \
		--os linux --arch "$ARCH" \
		--label org.opencontainers.image.title=network-node-manager \
		--label org.opencontainers.image.version="$VERSION" \
		--label org.opencontainers.image.revision="$COMMIT" \
		--label org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
		--label org.opencontainers.image.source=https://github.com/network-node-manager/network-node-manager \
		--label org.opencontainers.image.licenses=Apache-2.0 \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
	buildah commit --quiet --rm "$ctr" "$IMAGE:$TAG" >/dev/null
	trap - EXIT
	if [[ "$ARCH" == "$HOST_ARCH" && "$TAG" == "$VERSION" ]]; then
		buildah tag "$IMAGE:$TAG" "$IMAGE:latest" # local convenience (make test-image); manifests never use it
	fi
	buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE:$TAG"
}

main "$@"
