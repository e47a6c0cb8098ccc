#!/usr/bin/env bash
# The previous release's bundle for the cluster lane (make cluster), which installs it and upgrades
# from it (e2e/cluster/release_test.go). The release is hack/version.sh --previous: the latest
# CHANGELOG.md release, or at that release's own commit the one before it. Its source is a git
# worktree of the commit that wrote its heading, in bin/previous-release/<version>; its bundle is
# built by this checkout's hack/release.sh (the pinned base and tools of today, that commit's agent
# and manifests) for linux/amd64, the nodes' architecture, into bin/release/<version>. It is built
# once: a bundle whose SHA256SUMS exists is kept. Writes bin/cluster-images/previous.env.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" # NNM_ROOT, BIN

read -r version commit < <("$NNM_ROOT/hack/version.sh" --previous) || true
if [[ -z "${version:-}" ]]; then
	echo "hack/cluster/previous-release.sh: this commit has no previous release to upgrade from" >&2
	exit 1
fi
src="$BIN/previous-release/$version"
bundle="$BIN/release/$version"
if [[ "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)" != "$commit" ]]; then
	git -C "$NNM_ROOT" worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
	git -C "$NNM_ROOT" worktree prune
	mkdir -p "$(dirname "$src")"
	git -C "$NNM_ROOT" worktree add --detach "$src" "$commit" >/dev/null
	rm -rf "$bundle"
fi
if [[ ! -f "$bundle/SHA256SUMS" ]]; then
	echo "building the previous release $version (commit ${commit:0:12}) from $src"
	NNM_SOURCE_DIR="$src" VERSION="$version" ARCHES=amd64 RELEASE_DIR="$bundle" "$NNM_ROOT/hack/release.sh"
fi
mkdir -p "$BIN/cluster-images"
cat >"$BIN/cluster-images/previous.env" <<ENV
NNM_PREVIOUS_VERSION=$version
NNM_PREVIOUS_COMMIT=$commit
NNM_PREVIOUS_BUNDLE=$bundle
NNM_PREVIOUS_SOURCE=$src
ENV
echo "previous release $version: $bundle"
