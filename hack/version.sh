#!/usr/bin/env bash
# Prints the project's version, the one string the Makefile (VERSION), hack/image.sh and
# hack/release.sh stamp into the binary and the image tag:
#   - on a release tag:          v0.1.0                       (git describe --tags)
#   - after a release tag:       v0.1.0-3-gabc1234[-dirty]    (git describe --tags)
#   - before the first tag:      v0.1.0-dev.gabc1234[.dirty]  (CHANGELOG.md's latest "## vX.Y.Z"
#                                heading, marked as a pre-release of it, plus the commit)
#   - no git at all:             v0.1.0-dev
# Every form is a valid semantic version and a valid image tag (an image tag cannot hold the '+' of
# semver build metadata, so the commit is a pre-release identifier).
#
#   hack/version.sh --release   only CHANGELOG.md's latest release (the manifests' image tag)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
release="$(sed -nE 's/^## (v[0-9]+\.[0-9]+\.[0-9]+)([^0-9A-Za-z.].*)?$/\1/p' "$ROOT/CHANGELOG.md" | head -n1)"
[[ -n "$release" ]] || { echo "hack/version.sh: no '## vX.Y.Z' heading in CHANGELOG.md" >&2; exit 1; }
if [[ "${1:-}" == --release ]]; then
	echo "$release"
	exit 0
fi
if v="$(git -C "$ROOT" describe --tags --match 'v[0-9]*' --dirty 2>/dev/null)"; then
	echo "$v"
	exit 0
fi
if commit="$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null)"; then
	dirty=""
	git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || dirty=".dirty"
	echo "$release-dev.g$commit$dirty"
else
	echo "$release-dev"
fi
