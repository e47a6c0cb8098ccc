#!/usr/bin/env bash
# make release: the release bundle of this commit, without a Docker engine or a network beyond the
# Debian archive and the Go module proxy, in bin/release/$VERSION/:
#
#   image.oci.tar                the image for linux/amd64 and linux/arm64 (one index), with its
#                                cosign signature and SBOM attestations: an OCI image layout as
#                                `cosign save` writes it; `cosign load --dir` pushes all of it
#   image.digest                 the index's digest (sha256:…), which the manifests pin
#   sbom.linux-<arch>.spdx.json  the SBOM of each platform's image (SPDX 2.3 JSON, syft): the agent's
#                                Go modules and the image's Debian packages, with versions
#   install.yaml, uninstall.yaml deploy/base and deploy/uninstall rendered with the image pinned as
#                                network-node-manager:$VERSION@<digest> (your registry: an overlay's
#                                images entry, docs/deploy.md); no uninstall.yaml from a source
#                                whose deploy/uninstall is not a kustomization (v0.1.0)
#   network-node-manager-<v>.tgz the Helm chart, its version and image digest set to this build's
#   cosign.pub                   the public key of the signature and the attestations
#   SHA256SUMS, SHA256SUMS.sig   the checksums of every file above, and their cosign signature
#
# VERSION is hack/version.sh's (`make -s version`): vX.Y.Z only at the commit that wrote its
# CHANGELOG.md heading, a pre-release at any other. The steps: hack/image.sh builds each platform's
# image into buildah's storage (network-node-manager:$VERSION-<arch>); buildah pushes them as one
# index to a registry on loopback (the pinned CNCF Distribution, bin/registry); syft reads each
# platform's image from it; cosign signs the index and attests both SBOMs to it with the key, without
# a transparency log (no network); `cosign save` writes the signed index with its signature and
# attestations; the manifests and the chart are rendered from deploy/ and the chart's render is
# checked against install.yaml.
#
# Environment:
#   VERSION, COMMIT   as hack/image.sh (a release version is refused away from its commit)
#   ARCHES            default "amd64 arm64" (ARCHES=amd64 for the build machine's only)
#   COSIGN_KEY        the signing key: a cosign key file or a KMS URI (cosign's --key). Default:
#                     bin/release-key/cosign.key, generated once with an empty password, a key for
#                     development and tests, not for a release (docs/deploy.md, Cutting a release)
#   COSIGN_PASSWORD   the key file's password (default empty)
#   RELEASE_DIR       default bin/release/$VERSION
#   NNM_SOURCE_DIR    build another checkout's source (the cluster lane's previous release)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # NNM_ROOT, BIN
ROOT="$NNM_ROOT"
SRC="$(cd "${NNM_SOURCE_DIR:-$ROOT}" && pwd)"
export VERSION="${VERSION:-$(NNM_SOURCE_DIR="$SRC" "$ROOT/hack/version.sh")}"
export COMMIT="${COMMIT:-$(git -C "$SRC" rev-parse --short=12 HEAD 2>/dev/null || true)}"
ARCHES="${ARCHES:-amd64 arm64}"
IMAGE=network-node-manager
LIST="$IMAGE:$VERSION"
OUT="${RELEASE_DIR:-$BIN/release/$VERSION}"
CHART_VERSION="${VERSION#v}"

"$ROOT/hack/build-release-tools.sh" >/dev/null
COSIGN="$BIN/cosign" HELM="$BIN/helm" SYFT="$BIN/syft"
work="$(mktemp -d)"
registry_pid=""
cleanup() {
	[[ -z "$registry_pid" ]] || kill "$registry_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

for arch in $ARCHES; do
	echo "== linux/$arch"
	ARCH="$arch" TAG="$VERSION-$arch" "$ROOT/hack/image.sh"
done
buildah manifest rm "$LIST" >/dev/null 2>&1 || buildah rmi "$LIST" >/dev/null 2>&1 || true
buildah manifest create "$LIST" >/dev/null
for arch in $ARCHES; do
	buildah manifest add --os linux --arch "$arch" "$LIST" "containers-storage:localhost/$IMAGE:$VERSION-$arch" >/dev/null
done

# The registry on loopback: syft and cosign work on images in a registry.
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $work/registry}}
http: {addr: 127.0.0.1:$port}
EOF
"$BIN/registry" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$port/v2/" >/dev/null && break
	sleep 0.1
done
curl -sf "http://127.0.0.1:$port/v2/" >/dev/null || { cat "$work/registry.log" >&2; echo "hack/release.sh: the registry did not start" >&2; exit 1; }
REPO="127.0.0.1:$port/$IMAGE"

# --format oci: the index and the images as OCI media types, whose digests the bundle keeps.
buildah manifest push --all --quiet --format oci --tls-verify=false --digestfile "$work/digest" "$LIST" "docker://$REPO:$VERSION"
DIGEST="$(cat "$work/digest")"
REF="$REPO@$DIGEST"
echo "== pushed $LIST as index $DIGEST"

rm -rf "$OUT"
mkdir -p "$OUT"
echo "$DIGEST" >"$OUT/image.digest"

# The SBOM of each platform's image.
export SYFT_CHECK_FOR_APP_UPDATE=false SYFT_REGISTRY_INSECURE_USE_HTTP=true
for arch in $ARCHES; do
	"$SYFT" scan --quiet --platform "linux/$arch" "registry:$REF" -o "spdx-json=$OUT/sbom.linux-$arch.spdx.json"
done

# Sign the index and attest the SBOMs to it (offline: a key, no transparency log).
if [[ -z "${COSIGN_KEY:-}" ]]; then
	COSIGN_KEY="$BIN/release-key/cosign.key"
	if [[ ! -f "$COSIGN_KEY" ]]; then
		mkdir -p "$(dirname "$COSIGN_KEY")"
		(cd "$(dirname "$COSIGN_KEY")" && COSIGN_PASSWORD="" "$COSIGN" generate-key-pair >/dev/null)
		echo "generated a development signing key: $COSIGN_KEY (COSIGN_KEY names a release's key)"
	fi
fi
export COSIGN_PASSWORD="${COSIGN_PASSWORD:-}" COSIGN_YES=true
"$COSIGN" public-key --key "$COSIGN_KEY" >"$OUT/cosign.pub"
cosign_flags=(--key "$COSIGN_KEY" --tlog-upload=false --allow-http-registry)
"$COSIGN" sign "${cosign_flags[@]}" "$REF" 2>"$work/cosign.log" || { cat "$work/cosign.log" >&2; exit 1; }
for arch in $ARCHES; do
	"$COSIGN" attest "${cosign_flags[@]}" --type spdxjson --predicate "$OUT/sbom.linux-$arch.spdx.json" "$REF" 2>"$work/cosign.log" ||
		{ cat "$work/cosign.log" >&2; exit 1; }
done
"$COSIGN" save --allow-http-registry --dir "$work/oci" "$REF"
tar -C "$work/oci" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$OUT/image.oci.tar" .

# The manifests, pinned by tag and digest, and the chart of this build.
manifests() { (cd "$ROOT" && go run ./hack/manifests/cmd/manifests "$@"); }
manifests release "$SRC" base "$VERSION" "$DIGEST" >"$OUT/install.yaml"
# A source older than deploy/uninstall's kustomization (v0.1.0, which the cluster lane builds as the
# release it upgrades from) has no uninstall to render: its bundle goes without uninstall.yaml.
if [[ -f "$SRC/deploy/uninstall/kustomization.yaml" ]]; then
	manifests release "$SRC" uninstall "$VERSION" "$DIGEST" >"$OUT/uninstall.yaml"
else
	echo "== no uninstall.yaml: deploy/uninstall of commit $COMMIT is not a kustomization"
fi
if [[ -d "$SRC/deploy/helm/network-node-manager" ]]; then
	cp -r "$SRC/deploy/helm/network-node-manager" "$work/chart"
	sed -i -E "s/^version: .*/version: $CHART_VERSION/; s/^appVersion: .*/appVersion: $VERSION/" "$work/chart/Chart.yaml"
	sed -i -E "0,/^  digest: \"\"/s//  digest: \"$DIGEST\"/" "$work/chart/values.yaml"
	grep -q "^  digest: \"$DIGEST\"" "$work/chart/values.yaml" || { echo "hack/release.sh: values.yaml has no image digest to set" >&2; exit 1; }
	export HELM_CACHE_HOME="$work/helm" HELM_CONFIG_HOME="$work/helm" HELM_DATA_HOME="$work/helm"
	"$HELM" package "$work/chart" --destination "$OUT" >/dev/null
	"$HELM" template network-node-manager "$OUT/network-node-manager-$CHART_VERSION.tgz" --namespace kube-system >"$work/chart.yaml"
	manifests diff "$work/chart.yaml" "$OUT/install.yaml" |
		sed "s#$work/chart.yaml#the chart's default render#; s#$OUT/##"
fi

(cd "$OUT" && sha256sum -- * >SHA256SUMS)
"$COSIGN" sign-blob --key "$COSIGN_KEY" --tlog-upload=false --output-signature "$OUT/SHA256SUMS.sig" "$OUT/SHA256SUMS" 2>"$work/cosign.log" ||
	{ cat "$work/cosign.log" >&2; exit 1; }
# cosign writes the signature 0600; it is published like every other file of the bundle.
chmod 0644 "$OUT/SHA256SUMS.sig"

echo "== $OUT (release bundle of $VERSION, commit $COMMIT)"
(cd "$OUT" && ls -l --time-style=+ | awk 'NR > 1 {printf "  %10d  %s\n", $5, $NF}')
echo "== image index $DIGEST"
buildah manifest inspect "$LIST" >/dev/null
python3 - "$work/oci" "$DIGEST" <<'PY'
import json, os, sys
d, want = sys.argv[1], sys.argv[2]
def blob(dg):
    with open(os.path.join(d, "blobs", *dg.split(":"))) as f:
        return json.load(f)
idx = blob(want)
for m in idx["manifests"]:
    p = m.get("platform", {})
    img = blob(m["digest"])
    layers = ", ".join("%s %.1f MiB" % (l["digest"][:19], l["size"] / 2**20) for l in img["layers"])
    print("  %s/%s  %s  layers: %s" % (p.get("os"), p.get("architecture"), m["digest"], layers))
PY
for arch in $ARCHES; do
	python3 - "$OUT/sbom.linux-$arch.spdx.json" <<'PY'
import json, sys, collections
doc = json.load(open(sys.argv[1]))
kinds = collections.Counter()
for p in doc.get("packages", []):
    ref = next((r["referenceLocator"] for r in p.get("externalRefs", []) if r.get("referenceType") == "purl"), "")
    kinds[ref.split("/")[0].replace("pkg:", "") if ref else "other"] += 1
print("  %s: %s, %d packages (%s)" % (sys.argv[1].rsplit("/", 1)[1], doc.get("spdxVersion"), len(doc.get("packages", [])),
      ", ".join("%s %d" % kv for kv in sorted(kinds.items()))))
PY
done
