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

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${NNM_BIN_DIR:-$NNM_ROOT/bin}"
STAMP="$BIN/.promtool-stamp"
MOD="$NNM_ROOT/tools/promtool"

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

main() {
	mkdir -p "$BIN"
	local want
	want="$(nnm_inputs_hash hack/build-promtool.sh tools/promtool)"
	if nnm_up_to_date "$STAMP" "$want" "$BIN/promtool"; then
		echo "promtool in $BIN is up to date"
		return 0
	fi
	rm -f "$STAMP"
	local v
	v="$(cd "$MOD" && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
	echo "building promtool from github.com/prometheus/prometheus@$v"
	# promtool --version reports what common/version holds; stamp the pinned module version in.
	(cd "$MOD" && go build -trimpath \
		-ldflags="-s -w -X github.com/prometheus/common/version.Version=$v" \
		-o "$BIN/.promtool.tmp" github.com/prometheus/prometheus/cmd/promtool)
	mv -f "$BIN/.promtool.tmp" "$BIN/promtool"
	echo "$want" >"$STAMP"
	ls -lh "$BIN/promtool"
}

main "$@"
