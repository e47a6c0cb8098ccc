#!/usr/bin/env bash
# Prints the project's version, the one string the Makefile (VERSION), hack/image.sh and
# hack/release.sh stamp into the binary and the image tag. The version is written down once:
# CHANGELOG.md's latest "## vX.Y.Z" heading (main is the product; git tags are not read).
#
#   hack/version.sh             a pre-release build of this commit: v0.1.0-dev.gabc1234[.dirty]
#                               (v0.1.0-dev without git). `make image`, `make build`.
#   hack/version.sh --release   the release: v0.1.0, exactly the image tag deploy/components/release
#                               runs (TestImageTagIsTheRelease). `make release`, `make image RELEASE=1`.
#
# Both are valid semantic versions and image tags (an image tag cannot hold the '+' of semver build
# metadata, so the commit is a pre-release identifier). A release is cut by one commit on main that
# renames CHANGELOG.md's "## Unreleased" to the new "## vX.Y.Z" and sets the same tag in
# deploy/components/release (docs/deploy.md, "Cutting a release").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
release="$(sed -nE 's/^## (v[0-9]+\.[0-9]+\.[0-9]+)([^0-9A-Za-z.].*)?$/\1/p' "$ROOT/CHANGELOG.md" | head -n1)"
[[ -n "$release" ]] || { echo "hack/version.sh: no '## vX.Y.Z' heading in CHANGELOG.md" >&2; exit 1; }
case "${1:-}" in
--release)
	echo "$release"
	exit 0
	;;
"") ;;
*)
	echo "hack/version.sh: unknown argument $1 (none: pre-release of this commit; --release: CHANGELOG.md's release)" >&2
	exit 2
	;;
esac
if commit="$(git -C "$ROOT" rev-parse --short=7 HEAD 2>/dev/null)"; then
	dirty=""
	git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || dirty=".dirty"
	echo "$release-dev.g$commit$dirty"
else
	echo "$release-dev"
fi
