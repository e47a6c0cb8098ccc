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

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${NNM_BIN_DIR:-$ROOT/bin}"
STAMP="$BIN/.promtool-stamp"
MOD="$ROOT/tools/promtool"

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

inputs_hash() {
	(
		cd "$ROOT"
		go env GOVERSION GOOS GOARCH
		sha256sum hack/build-promtool.sh
		find tools/promtool -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 |
			LC_ALL=C sort -z | xargs -0 sha256sum
	) | sha256sum | cut -d' ' -f1
}

main() {
	mkdir -p "$BIN"
	local want
	want="$(inputs_hash)"
	if [[ "${FORCE:-0}" != 1 && -x "$BIN/promtool" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
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
