#!/usr/bin/env bash
# Builds Calico Felix for the Felix lane (e2e/felix, `make test-felix`): the real calico-felix binary,
# with cgo and a static libbpf, from a local git snapshot of Calico (no network access needed).
#
#   hack/felix/build.sh          install what is missing (root on Debian), build Felix once into the
#                                cache; prints the path of felix.env (the Go test reads it)
#   hack/felix/build.sh --env    only print the path of felix.env
#
# Inputs (git directories; a bare mirror is enough, nothing is checked out):
#   CALICO_GIT_DIR   Calico's repository (required; e.g. a bare clone of
#                    https://github.com/projectcalico/calico)
#   LIBBPF_GIT_DIR   libbpf's repository (required; e.g. a bare clone of https://github.com/libbpf/libbpf)
#   CALICO_COMMIT    the Calico commit to build (default: the pinned one below, the one the lane was
#                    tested with); libbpf's version is read from that commit's metadata.mk
#                    (LIBBPF_VERSION), as Calico's own build does.
# A git snapshot is the way in: the Go module proxy does not serve usable Calico versions.
#
# Output, in $NNM_FELIX_DIR (default /var/cache/network-node-manager/felix/<calico>-libbpf<v>-go<v>):
#   calico-felix, crds/ (Calico's CRDs from libcalico-go/config/crd), felix.env
# The cache key is the Calico commit, the libbpf version and the Go version: a second run with the
# same three returns at once. The first build downloads Calico's modules and needs ~10 minutes of CPU
# (9m43s user, 58 min wall on 2 cores shared with other builds, 2026-12-01); the cgo build of Felix
# alone takes ~30 s with a warm module and build cache. The binary is ~135 MB.
#
# A missing input (no Calico or libbpf repository, the commit or the libbpf tag not in it, a package
# that cannot be installed) is an error (exit 1) naming it: the lane is opt-in, so when it is asked
# for, it must not quietly do nothing.
set -euo pipefail

# The Calico commit the lane was tested with (master, 2026-08-22).
CALICO_COMMIT="${CALICO_COMMIT:-87c15906f20c4ca1fda55af92295e7678b0cc0b2}"
# Where the two repositories are is the machine's business, not the tree's: no default.
[[ -n "${CALICO_GIT_DIR:-}" ]] || { echo "hack/felix/build.sh: set CALICO_GIT_DIR to the git directory of a clone of Calico (git clone --bare https://github.com/projectcalico/calico)" >&2; exit 1; }
[[ -n "${LIBBPF_GIT_DIR:-}" ]] || { echo "hack/felix/build.sh: set LIBBPF_GIT_DIR to the git directory of a clone of libbpf (git clone --bare https://github.com/libbpf/libbpf)" >&2; exit 1; }
GO="${GO:-go}"

# What the cgo build needs, and ipset, which Felix runs (it panics without it, in both data plane
# modes), as "probe:debian-package" (a probe is a header or a binary).
DEPS=(/usr/include/gelf.h:libelf-dev /usr/include/zlib.h:zlib1g-dev /usr/include/pcap.h:libpcap-dev
	gcc:gcc make:make ipset:ipset)

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

die() { echo "hack/felix/build.sh: $*" >&2; exit 1; }

[[ -d $CALICO_GIT_DIR ]] || die "no Calico repository at CALICO_GIT_DIR=$CALICO_GIT_DIR (fetch github:projectcalico/calico, or clone it, and point CALICO_GIT_DIR at its git directory)"
git --git-dir="$CALICO_GIT_DIR" cat-file -e "$CALICO_COMMIT^{commit}" 2>/dev/null ||
	die "Calico commit $CALICO_COMMIT is not in $CALICO_GIT_DIR"
LIBBPF_VERSION="$(git --git-dir="$CALICO_GIT_DIR" show "$CALICO_COMMIT:metadata.mk" | sed -n 's/^LIBBPF_VERSION=//p')"
[[ -n $LIBBPF_VERSION ]] || die "no LIBBPF_VERSION in metadata.mk of Calico $CALICO_COMMIT"
GO_VERSION="$($GO env GOVERSION)"
OUT="${NNM_FELIX_DIR:-/var/cache/network-node-manager/felix/${CALICO_COMMIT:0:12}-libbpf${LIBBPF_VERSION}-${GO_VERSION}}"

if [[ ${1:-} == --env ]]; then
	echo "$OUT/felix.env"
	exit 0
fi

nnm_install_deps die "${DEPS[@]}"
if [[ -f $OUT/felix.env && -x $OUT/calico-felix ]]; then
	echo "$OUT/felix.env"
	exit 0
fi

[[ -d $LIBBPF_GIT_DIR ]] || die "no libbpf repository at LIBBPF_GIT_DIR=$LIBBPF_GIT_DIR (fetch github:libbpf/libbpf and point LIBBPF_GIT_DIR at its git directory)"
git --git-dir="$LIBBPF_GIT_DIR" cat-file -e "$LIBBPF_VERSION^{commit}" 2>/dev/null ||
	die "libbpf $LIBBPF_VERSION (Calico's metadata.mk) is not in $LIBBPF_GIT_DIR"

mkdir -p "$OUT"
SRC="$OUT/src"
rm -rf "$SRC"
mkdir -p "$SRC"
trap 'rm -rf "$SRC"' EXIT
echo "unpacking Calico ${CALICO_COMMIT:0:12} and libbpf $LIBBPF_VERSION into $SRC" >&2
git --git-dir="$CALICO_GIT_DIR" archive "$CALICO_COMMIT" | tar -x -C "$SRC"
mkdir -p "$SRC/felix/bpf-gpl/libbpf"
git --git-dir="$LIBBPF_GIT_DIR" archive "$LIBBPF_VERSION" | tar -x -C "$SRC/felix/bpf-gpl/libbpf"
mkdir -p "$SRC/felix/bpf-gpl/libbpf/src/amd64"
make -s -C "$SRC/felix/bpf-gpl/libbpf/src" -j"$(nproc)" BUILD_STATIC_ONLY=1 OBJDIR=amd64 >&2

# Felix's cgo flags point at bpf-gpl/libbpf/src/amd64 (felix/bpf/libbpf); -trimpath keeps the cache
# directory out of the binary.
echo "building calico-felix (cgo)" >&2
(cd "$SRC" && CGO_ENABLED=1 "$GO" build -trimpath -o "$OUT/calico-felix.tmp" ./felix/cmd/calico-felix) >&2
mv "$OUT/calico-felix.tmp" "$OUT/calico-felix"
rm -rf "$OUT/crds"
cp -r "$SRC/libcalico-go/config/crd" "$OUT/crds"

# Whether this Felix has an nftables data plane (FELIX_NFTABLESMODE); the test runs that mode too
# when it does.
nft=false
grep -rqs 'NFTablesMode' "$SRC/felix/config/config_params.go" && nft=true
cat >"$OUT/felix.env.tmp" <<ENV
NNM_FELIX_BIN=$OUT/calico-felix
NNM_FELIX_CRDS=$OUT/crds
NNM_FELIX_CALICO_COMMIT=$CALICO_COMMIT
NNM_FELIX_LIBBPF_VERSION=$LIBBPF_VERSION
NNM_FELIX_NFTABLES=$nft
ENV
mv "$OUT/felix.env.tmp" "$OUT/felix.env"
echo "$OUT/felix.env"
