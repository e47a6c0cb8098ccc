# Local Kubernetes control plane (etcd + kube-apiserver) for tests and the demo.
# Include from the main Makefile:   include Makefile.controlplane.mk
#
#   make controlplane       build bin/etcd and bin/kube-apiserver (no-op when the
#                           pinned versions in tools/*/go.{mod,sum} are unchanged)
#   make controlplane-test  run the internal/controlplane tests (needs root)

.PHONY: controlplane controlplane-test
controlplane:
	./hack/build-controlplane.sh

controlplane-test: controlplane
	go test -count=1 ./internal/controlplane/...
