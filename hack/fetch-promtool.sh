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
# Fetched again only when this script changes (a hash of it is kept in bin/.promtool-stamp).
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
	nnm_have apt-get || { echo "hack/fetch-promtool.sh: no apt-get to fetch prometheus=$VERSION (Debian only)" >&2; exit 1; }
	local tmp
	tmp="$(mktemp -d)"
	# apt-get download runs as _apt where it can; let it write the download directory.
	chmod 0777 "$tmp"
	echo "fetching promtool from Debian's prometheus=$VERSION"
	if ! (cd "$tmp" && apt-get download -q "prometheus=$VERSION" >/dev/null 2>"$tmp/err"); then
		(cd "$tmp" && DEBIAN_FRONTEND=noninteractive apt-get update -qq && apt-get download -q "prometheus=$VERSION" >/dev/null 2>"$tmp/err") ||
			{ cat "$tmp/err" >&2; rm -rf "$tmp"; echo "hack/fetch-promtool.sh: cannot download prometheus=$VERSION (set NNM_PROMTOOL_DEB_VERSION to one that apt-cache policy prometheus lists)" >&2; exit 1; }
	fi
	dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
	mv -f "$tmp/x/usr/bin/promtool" "$BIN/promtool"
	rm -rf "$tmp"
	"$BIN/promtool" --version | head -1
}

nnm_stamped_build promtool "$(cd "$NNM_ROOT" && sha256sum hack/fetch-promtool.sh | cut -d' ' -f1)" fetch "$BIN/promtool"
