#!/usr/bin/env bash
# Builds bin/promtool from tools/promtool (github.com/prometheus/prometheus/cmd/promtool, pinned in
# go.mod/go.sum). make test uses it to check and unit test deploy/components/prometheusrule.
#
# Rebuilt only when the pinned inputs change: a hash of the tools module's go.mod/go.sum/*.go, this
# script and the Go version is kept in bin/.promtool-stamp (as hack/build-controlplane.sh does).
#
# Environment:
#   NNM_BIN_DIR  output directory (default: <repo>/bin)
#   FORCE=1      rebuild even if the stamp matches
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # sets NNM_ROOT and BIN

MOD="$NNM_ROOT/tools/promtool"

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

build() {
	local v
	v="$(cd "$MOD" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
	# promtool --version reports what common/version holds; stamp the pinned module version in.
	nnm_go_build "$MOD" github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool promtool \
		"-X github.com/prometheus/common/version.Version=$v"
}

nnm_stamped_build promtool "$(nnm_inputs_hash hack/build-promtool.sh tools/promtool)" build "$BIN/promtool"
