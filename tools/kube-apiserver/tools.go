//go:build tools

// Package tools pins kube-apiserver and kube-proxy so that
//
//	go build k8s.io/kubernetes/cmd/kube-apiserver
//	go build k8s.io/kubernetes/cmd/kube-proxy
//
// run from this module builds the exact version in go.mod/go.sum. Both come
// from the same k8s.io/kubernetes release, so the e2e tests run the agent
// beside the kube-proxy of the API server they talk to.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
