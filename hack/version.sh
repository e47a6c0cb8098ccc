#!/usr/bin/env bash
# Prints the version a build of this commit gets: the one string the Makefile (VERSION, `make -s
# version`), hack/image.sh and hack/release.sh stamp into the binary, the image tag, the chart.
#
# Releases are written down once: CHANGELOG.md's "## vX.Y.Z" headings, newest first. A release's
# commit is the commit that wrote its heading (git log -S), so the version is a function of the
# commit and needs no git tag:
#
#   hack/version.sh              this commit's version:
#                                  the release commit of vX.Y.Z, clean tree:  vX.Y.Z
#                                  any other commit:  v<next>-dev.<n>.g<commit>[.dirty]
#                                n is the number of commits since the latest release's commit and
#                                <commit> the 12-digit abbreviated hash, so no two commits share a
#                                version; <next> is the next minor release (v0.1.0 → v0.2.0), or
#                                the version the "## Unreleased" heading names ("## Unreleased —
#                                v0.1.1"), so a pre-release sorts after the latest release and
#                                before the next (semver: 0.1.0 < 0.2.0-dev.5.g… < 0.2.0-dev.6.g… < 0.2.0).
#                                A tree with uncommitted changes is never a release: it gets the
#                                pre-release with ".dirty".
#   hack/version.sh --latest     the latest release heading (vX.Y.Z): the tag deploy/components/release
#                                and the chart's appVersion run (TestImageTagIsTheRelease).
#   hack/version.sh --previous   "vX.Y.Z <commit>": the release an upgrade of this commit starts
#                                from: the latest release, or, at the latest release's own commit,
#                                the one before it. Nothing when there is none. The cluster lane
#                                builds and installs it before upgrading (e2e/cluster).
#   hack/version.sh --commit vX.Y.Z   the commit that wrote that release's heading.
#
# Without git (a source tarball) the version is v<next>-dev: it names no commit, and hack/image.sh
# refuses to build a release from it.
set -euo pipefail
# NNM_SOURCE_DIR: another checkout to answer for (hack/image.sh builds the previous release from a
# worktree of its commit with this script).
ROOT="${NNM_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
CHANGELOG="$ROOT/CHANGELOG.md"
die() { echo "hack/version.sh: $*" >&2; exit 1; }

# The release headings, newest first: "## vX.Y.Z" followed by nothing or a non-version character
# ("## v0.1.0 — 2026-12-08").
releases() { sed -nE 's/^## (v[0-9]+\.[0-9]+\.[0-9]+)([^0-9A-Za-z.+-].*)?$/\1/p' "$CHANGELOG"; }

# release_commit VERSION: the newest commit of HEAD's history that added the heading of VERSION.
release_commit() {
	local v="$1" c
	# -S lists the commits that changed how often the string occurs: the one that added it, and one
	# that removed it if any; the newest whose CHANGELOG.md has the heading is the release's.
	for c in $(git -C "$ROOT" log --format=%H -S"## $v" -- CHANGELOG.md); do
		if git -C "$ROOT" show "$c:CHANGELOG.md" 2>/dev/null | grep -qE "^## ${v//./\\.}([^0-9A-Za-z.+-]|$)"; then
			echo "$c"
			return 0
		fi
	done
	return 1
}

have_git() { git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null 2>&1; }

mapfile -t all < <(releases)
[[ ${#all[@]} -gt 0 ]] || die "no '## vX.Y.Z' heading in CHANGELOG.md"
latest="${all[0]}"

case "${1:-}" in
--latest)
	echo "$latest"
	exit 0
	;;
--commit)
	[[ -n "${2:-}" ]] || die "--commit needs a version (vX.Y.Z)"
	have_git || die "not a git checkout: cannot find the commit of $2"
	release_commit "$2" || die "no commit wrote the heading '## $2' of CHANGELOG.md"
	exit 0
	;;
--previous | "") ;;
*)
	die "unknown argument $1 (none: this commit's version; --latest, --previous, --commit vX.Y.Z)"
	;;
esac

# The next release: the version the Unreleased heading names, else the next minor one.
next="$(sed -nE 's/^## Unreleased.*[^0-9A-Za-z.](v[0-9]+\.[0-9]+\.[0-9]+)([^0-9A-Za-z.+-].*)?$/\1/p' "$CHANGELOG" | head -n1)"
if [[ -z "$next" ]]; then
	IFS=. read -r major minor _ <<<"${latest#v}"
	next="v$major.$((minor + 1)).0"
elif [[ "$next" == "$latest" || "$(printf '%s\n' "$latest" "$next" | sort -V | tail -n1)" != "$next" ]]; then
	die "the '## Unreleased' heading names $next, which is not after the latest release $latest"
fi

if ! have_git; then
	[[ "${1:-}" == --previous ]] && die "not a git checkout: no previous release commit"
	echo "$next-dev"
	exit 0
fi

head="$(git -C "$ROOT" rev-parse HEAD)"
latest_commit="$(release_commit "$latest")" || die "no commit of this history wrote CHANGELOG.md's heading '## $latest'"

if [[ "${1:-}" == --previous ]]; then
	if [[ "$head" == "$latest_commit" ]]; then
		[[ ${#all[@]} -gt 1 ]] || exit 0
		prev="${all[1]}"
		echo "$prev $(release_commit "$prev" || die "no commit wrote the heading '## $prev'")"
	else
		echo "$latest $latest_commit"
	fi
	exit 0
fi

dirty=""
git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || dirty=".dirty"
if [[ "$head" == "$latest_commit" && -z "$dirty" ]]; then
	echo "$latest"
	exit 0
fi
n="$(git -C "$ROOT" rev-list --count "$latest_commit..HEAD")"
echo "$next-dev.$n.g$(git -C "$ROOT" rev-parse --short=12 HEAD)$dirty"
