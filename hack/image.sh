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
# The base is pinned: the packages debootstrap installs (minbase + iptables + nftables and their
# dependencies) must be exactly those of hack/image/$SUITE-$ARCH.lock ("package=version" a line),
# or the build fails naming what the Debian archive serves instead (the archive keeps only the
# current point release: review the change, then `make image-lock` writes the lock anew). Files that
# record when or where the base was made (logs, caches, /etc/shadow's change dates, machine-id) are
# removed or fixed, and the image's layers and config carry the source commit's time
# (SOURCE_DATE_EPOCH: `buildah commit --timestamp`, the created label), so two builds of one commit
# from one base give the same image digest (docs/deploy.md, Images, says what differs otherwise).
#
# The base is cached as bin/image-base-$ARCH.tar, keyed by a hash of this script and the lock, the
# downloaded packages in bin/debootstrap-cache-$ARCH; rebuilding the image after a code change takes
# seconds.
#
# Environment:
#   VERSION          main.version and the default tag (default: hack/version.sh of the source: a
#                    release vX.Y.Z only at its release commit, else a pre-release of the commit).
#                    A release version is refused unless it is hack/version.sh's for the source (a
#                    release builds only from its own commit, with no uncommitted changes)
#   COMMIT           main.commit (default: git rev-parse --short=12 HEAD of the source)
#   NNM_SOURCE_DIR   the checkout whose agent is built (default: this one); the cluster lane builds
#                    the previous release from a worktree of its commit with this script
#   ARCH             Debian/Go architecture: amd64, arm64 (default: the build machine's)
#   TAG              image tag (default: $VERSION, plus :latest for the build machine's architecture)
#   NNM_BIN_DIR      cache and binary directory (default <repo>/bin)
#   DEBIAN_MIRROR    default http://deb.debian.org/debian
#   IMAGE_EXPORT=DIR also copy the image's root filesystem to DIR (for tests)
#   IMAGE_LOCK=1     write hack/image/$SUITE-$ARCH.lock from what debootstrap installed (make image-lock)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${NNM_BIN_DIR:-$ROOT/bin}"
SRC="$(cd "${NNM_SOURCE_DIR:-$ROOT}" && pwd)"
# What this source's commit is: its version (hack/version.sh of this checkout applied to the source)
# and its time, which the image carries instead of the build's.
SRC_VERSION="$(NNM_SOURCE_DIR="$SRC" "$ROOT/hack/version.sh")"
VERSION="${VERSION:-$SRC_VERSION}"
if [[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ && "$VERSION" != "$SRC_VERSION" ]]; then
	echo "hack/image.sh: $VERSION is a release version, and this source builds $SRC_VERSION: a release builds only from the commit that wrote its CHANGELOG.md heading, without uncommitted changes" >&2
	exit 1
fi
COMMIT="${COMMIT:-$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || true)}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$SRC" log -1 --format=%ct HEAD 2>/dev/null || date +%s)}"
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

LOCK="$ROOT/hack/image/$SUITE-$ARCH.lock"
base_hash() { { sha256sum "$ROOT/hack/image.sh"; cat "$LOCK" 2>/dev/null; echo "$SUITE $MIRROR $PACKAGES $ARCH"; } | sha256sum | cut -d' ' -f1; }

# installed ROOTFS: the base's packages as "package=version", sorted, from its dpkg database.
installed() {
	awk -F': ' '/^Package: /{p=$2} /^Version: /{v=$2} /^$/{if (p) print p "=" v; p=""} END{if (p) print p "=" v}' "$1/var/lib/dpkg/status" | LC_ALL=C sort
}

# check_lock ROOTFS: the packages debootstrap installed are the lock's, or the build stops naming
# the difference (IMAGE_LOCK=1 writes the lock instead).
check_lock() {
	local got
	got="$(installed "$1")"
	if [[ "${IMAGE_LOCK:-}" == 1 ]]; then
		mkdir -p "$(dirname "$LOCK")"
		{
			echo "# The packages of the image's Debian $SUITE base for $ARCH (debootstrap --variant=minbase"
			echo "# --include=$PACKAGES), package=version. hack/image.sh fails when the archive serves others."
			echo "# Written by make image-lock; review the change (a Debian point or security release) before committing it."
			echo "$got"
		} >"$LOCK"
		echo "wrote $LOCK ($(wc -l <<<"$got") packages)"
		return
	fi
	[[ -f "$LOCK" ]] || { echo "hack/image.sh: no $LOCK: make image-lock writes it" >&2; exit 1; }
	local want diff
	want="$(grep -v '^#' "$LOCK" | LC_ALL=C sort)"
	if ! diff="$(diff <(echo "$want") <(echo "$got"))"; then
		echo "hack/image.sh: the Debian archive ($MIRROR) serves other packages for $SUITE/$ARCH than $LOCK pins ('<' pinned, '>' served):" >&2
		echo "$diff" | grep '^[<>]' >&2
		echo "review the change (a point or security release), then make image-lock and commit the lock" >&2
		exit 1
	fi
}

# base: bookworm minbase + iptables + nftables of $ARCH, as a tarball of its root filesystem.
base() {
	local want
	want="$(base_hash)"
	if [[ "${IMAGE_LOCK:-}" != 1 && -f "$BASE" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
		echo "base $SUITE/$ARCH ($PACKAGES, pinned by ${LOCK#$ROOT/}) cached in $BASE"
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
		# nftables and their libraries) the way debootstrap does, keeping merged-/usr's symlinks,
		# and record each in the dpkg database as unpacked (its maintainer scripts did not run:
		# above), so that the database, and the SBOM read from it, lists what the image holds.
		local deb
		: >"$r/var/lib/dpkg/status"
		for deb in $(cut -d' ' -f2 "$r/debootstrap/debpaths"); do
			dpkg-deb --fsys-tarfile "$r$deb" | tar -C "$r" --keep-directory-symlink -xf -
			{ dpkg-deb -f "$r$deb" | sed '/^Package: /a Status: install ok unpacked'; echo; } >>"$r/var/lib/dpkg/status"
		done
	fi
	# The debs a --foreign stage keeps for its second stage are not part of the image.
	rm -rf "$r/debootstrap"
	check_lock "$r"
	want="$(base_hash)" # a lock just written is part of the key
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
	# What records when or on which machine the base was made, so that a rebuild gives the same
	# bytes: logs, caches of the package tools and ld.so, dpkg's backup files, the machine id, and
	# the day of the last password change in /etc/shadow (set to 0, "change at next login", for
	# accounts that have no password to change).
	rm -rf "$r"/var/log/apt "$r"/var/log/alternatives.log "$r"/var/log/bootstrap.log "$r"/var/cache/ldconfig/aux-cache \
		"$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old "$r"/etc/*- "$r"/var/lib/dpkg/lock* "$r"/var/cache/apt/archives/lock \
		"$r"/var/lib/dpkg/triggers/Lock "$r"/var/cache/apt/archives/partial
	[[ ! -e "$r/etc/machine-id" ]] || : >"$r/etc/machine-id"
	[[ ! -f "$r/etc/shadow" ]] || sed -i -E 's/^([^:]*:[^:]*:)[0-9]+:/\10:/' "$r/etc/shadow"
	# Sorted, with the owners and modes of the files and the times of a fixed epoch: the tarball is a
	# function of the packages (buildah commit --timestamp sets the layer's times anyway).
	tar -C "$r" --sort=name --numeric-owner --mtime=@0 --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$BASE.tmp" .
	mv -f "$BASE.tmp" "$BASE"
	rm -rf "$dir"
	echo "$want" >"$STAMP"
}

agent() {
	echo "building the agent $VERSION for linux/$ARCH from ${SRC}"
	(cd "$SRC" && CGO_ENABLED=0 GOOS=linux GOARCH="$ARCH" go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$BIN/.image-agent-$ARCH" ./cmd/network-node-manager)
}

main() {
	base
	[[ "${IMAGE_LOCK:-}" != 1 ]] || return 0
	agent
	local ctr mnt
	ctr="$(buildah from scratch)"
	trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
	mnt="$(buildah mount "$ctr")"
	tar -C "$mnt" --numeric-owner -xf "$BASE"
	install -D -m 0755 "$BIN/.image-agent-$ARCH" "$mnt/usr/local/bin/network-node-manager"
	# (a source from before the file existed, such as an older release, goes without it)
	[[ ! -f "$SRC/deploy/image/connlabel.conf" ]] ||
		install -D -m 0644 "$SRC/deploy/image/connlabel.conf" "$mnt/etc/xtables/connlabel.conf"
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
		--label org.opencontainers.image.created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)" \
		--label org.opencontainers.image.source=https://github.com/network-node-manager/network-node-manager \
		--label org.opencontainers.image.licenses=Apache-2.0 \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
	# The commit's time as the image's creation time and every file's time in the layer.
	buildah commit --quiet --rm --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$IMAGE:$TAG" >/dev/null
	trap - EXIT
	if [[ "$ARCH" == "$HOST_ARCH" && "$TAG" == "$VERSION" ]]; then
		buildah tag "$IMAGE:$TAG" "$IMAGE:latest" # local convenience (make test-image); manifests never use it
	fi
	buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE:$TAG"
}

main "$@"
