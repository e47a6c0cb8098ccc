# Local Kubernetes control plane (etcd + kube-apiserver) and kube-proxy for tests and the demo.
# Include from the main Makefile:   include Makefile.controlplane.mk
#
#   make controlplane       build bin/etcd, bin/kube-apiserver and bin/kube-proxy (no-op when the
#                           pinned versions in tools/*/go.{mod,sum} are unchanged)
#   make controlplane-test  run the internal/testing/controlplane tests (needs root)

.PHONY: controlplane controlplane-test
controlplane:
	./hack/build-controlplane.sh

controlplane-test: controlplane
	go test -count=1 ./internal/testing/controlplane/...
