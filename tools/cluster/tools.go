//go:build tools

// Package tools pins the node and control-plane binaries of the cluster lane (make test-cluster):
//
//	go build k8s.io/kubernetes/cmd/kubelet
//	go build k8s.io/kubernetes/cmd/kube-controller-manager
//	go build k8s.io/kubernetes/cmd/kube-scheduler
//	go build k8s.io/kubernetes/cmd/kubectl
//
// run from this module builds the exact version in go.mod/go.sum: the same k8s.io/kubernetes
// release as tools/kube-apiserver (kube-apiserver, kube-proxy), in a module of its own so that
// the control plane's build stamp (hack/build-controlplane.sh) does not change with it.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
