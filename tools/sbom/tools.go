//go:build tools

// Package tools pins Anchore's syft, which writes the release image's SBOM (SPDX JSON: the Go
// modules of the agent and the image's Debian packages, with versions) in make release:
//
//	go build github.com/anchore/syft/cmd/syft
//
// run from this module builds the exact version in go.mod/go.sum (hack/build-release-tools.sh).
package tools

import _ "github.com/anchore/syft/cmd/syft"
