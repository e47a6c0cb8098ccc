//go:build tools

// Package tools pins kube-apiserver so that
//
//	go build k8s.io/kubernetes/cmd/kube-apiserver
//
// run from this module builds the exact version in go.mod/go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
