//go:build tools

// Package tools pins the kube-proxy of Kubernetes v1.35.4 for the version matrix
// (make test-kube-versions, hack/build-kube-proxies.sh):
//
//	go build k8s.io/kubernetes/cmd/kube-proxy
//
// run from this module builds the exact version in go.mod/go.sum. The project's own pin
// (tools/kube-apiserver) is the newest supported release; this module holds an older one that
// fleets still run, so the agent is tested beside it too.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
