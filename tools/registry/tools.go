//go:build tools

// Package tools pins the CNCF Distribution registry (the reference OCI registry, `registry serve
// CONFIG`), which the cluster lane runs over TLS on the nodes' network: make release's bundle is
// pushed to it with its signature and SBOM attestations, and the kubelets pull the agent from it.
// make release runs it on loopback to sign the image and save it with its signature:
//
//	go build github.com/distribution/distribution/v3/cmd/registry
//
// run from this module builds the exact version in go.mod/go.sum (hack/build-release-tools.sh).
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
