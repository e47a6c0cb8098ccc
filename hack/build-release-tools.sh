#!/usr/bin/env bash
# Builds the release tools from their pinned Go modules (each in tools/<name>/go.mod, go.sum):
#   bin/cosign    github.com/sigstore/cosign/v2         (tools/cosign)   sign, attest, verify, save, load
#   bin/helm      helm.sh/helm/v4                       (tools/helm)     package, template, install
#   bin/registry  github.com/distribution/distribution/v3 (tools/registry) the OCI registry
#   bin/syft      github.com/anchore/syft               (tools/sbom)     the image's SBOM
# Each is rebuilt only when its module, this script or the Go version change (bin/.<name>-stamp),
# so `make release` and the tests that need one (helm for deploy/'s chart tests) reuse them.
#
#   hack/build-release-tools.sh [NAME...]    default: all four
#
# Environment: NNM_BIN_DIR (default <repo>/bin), FORCE=1 rebuilds.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # NNM_ROOT, BIN

export CGO_ENABLED=0 GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false"

# name → "tools dir|module|package|ldflags"
declare -A TOOL=(
	[cosign]="cosign|github.com/sigstore/cosign/v2|github.com/sigstore/cosign/v2/cmd/cosign|sigs.k8s.io/release-utils/version.gitVersion=@VERSION@"
	[helm]="helm|helm.sh/helm/v4|helm.sh/helm/v4/cmd/helm|helm.sh/helm/v4/internal/version.version=@VERSION@"
	[registry]="registry|github.com/distribution/distribution/v3|github.com/distribution/distribution/v3/cmd/registry|github.com/distribution/distribution/v3/version.version=@VERSION@"
	[syft]="sbom|github.com/anchore/syft|github.com/anchore/syft/cmd/syft|main.version=@VERSION@"
)

build_one() {
	local name="$1" dir mod pkg ld version
	IFS='|' read -r dir mod pkg ld <<<"${TOOL[$name]}"
	dir="$NNM_ROOT/tools/$dir"
	# Stamp the pinned version where the tool reports it (`cosign version`, `helm version`, ...), as
	# their own release builds do.
	version="$(cd "$dir" && go list -m -f '{{.Version}}' "$mod")"
	nnm_go_build "$dir" "$mod" "$pkg" "$name" "-X ${ld//@VERSION@/$version}"
}

names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=(cosign helm registry syft)
for name in "${names[@]}"; do
	[[ -n "${TOOL[$name]:-}" ]] || { echo "hack/build-release-tools.sh: unknown tool $name (cosign, helm, registry, syft)" >&2; exit 2; }
	IFS='|' read -r dir _ <<<"${TOOL[$name]}"
	# shellcheck disable=SC2317 # called by nnm_stamped_build
	build() { build_one "$name"; }
	nnm_stamped_build "$name" "$(nnm_inputs_hash hack/build-release-tools.sh "tools/$dir")" build "$BIN/$name"
done
