#!/usr/bin/env bash
# Puts bin/promtool in place: the promtool of Debian's prometheus package at the pinned version below,
# fetched with `apt-get download` and unpacked (nothing is installed, no service is set up). make test
# uses it to check and unit test deploy/components/prometheusrule.
#
# Debian's binary, not a build from the Go module proxy: github.com/prometheus/prometheus/cmd/promtool
# pulls in every service discovery SDK (AWS, Azure, GCP, Kubernetes, ...), and building it on a fresh
# 2-core machine took 7 minutes of `make test` (issue #22); the package is 19 MB and unpacks in
# seconds. `promtool check rules` and `promtool test rules` are all the tests use.
#
# Fetched again only when this script or the version changes (a hash of both is kept in
# bin/.promtool-stamp).
#
# Environment:
#   NNM_BIN_DIR                 output directory (default: <repo>/bin)
#   NNM_PROMTOOL_DEB_VERSION    the prometheus package version (default below; `apt-cache policy
#                               prometheus` lists what the machine's archive offers)
#   FORCE=1                     fetch even if the stamp matches
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # sets NNM_ROOT and BIN

VERSION="${NNM_PROMTOOL_DEB_VERSION:-2.42.0+ds-5+deb12u1}"

fetch() {
	local tmp
	tmp="$(mktemp -d)"
	nnm_deb_unpack "prometheus=$VERSION" "$tmp/x" ||
		{ rm -rf "$tmp"; echo "hack/fetch-promtool.sh: cannot download prometheus=$VERSION (set NNM_PROMTOOL_DEB_VERSION to one that apt-cache policy prometheus lists)" >&2; exit 1; }
	mv -f "$tmp/x/usr/bin/promtool" "$BIN/promtool"
	rm -rf "$tmp"
	"$BIN/promtool" --version | head -1
}

nnm_stamped_build promtool "$(cd "$NNM_ROOT" && { cat hack/fetch-promtool.sh; echo "$VERSION"; } | sha256sum | cut -d' ' -f1)" fetch "$BIN/promtool"
