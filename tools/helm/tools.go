//go:build tools

// Package tools pins Helm v4, which packages and renders deploy/helm/network-node-manager (make
// release, the chart's tests in deploy/) and installs it in the cluster lane:
//
//	go build helm.sh/helm/v4/cmd/helm
//
// run from this module builds the exact version in go.mod/go.sum (hack/build-release-tools.sh).
package tools

import _ "helm.sh/helm/v4/cmd/helm"
