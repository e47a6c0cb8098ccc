//go:build tools

// Package tools pins sigstore's cosign, which `make release` uses to sign the release image and
// attest its SBOM with a key (hack/release.sh), and the cluster lane to verify them as
// docs/deploy.md says:
//
//	go build github.com/sigstore/cosign/v2/cmd/cosign
//
// run from this module builds the exact version in go.mod/go.sum (hack/build-release-tools.sh).
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
