# network-node-manager — build, test, demo.
#
#   make demo    build everything and watch the agent program rules against a local control plane
#   make test    unit, kernel (network namespace) and end-to-end tests; needs root for the last two
#   make bench   scale benchmarks (slow; not part of make test)
#
# Every tool is built from pinned versions (go.mod, tools/*/go.mod) or, for promtool, taken from a
# pinned Debian package (hack/fetch-promtool.sh); missing system packages are
# installed with apt-get on Debian when running as root.

SHELL       := /bin/bash
GO          ?= go
# The version a build of this commit gets (`make -s version` prints it): the release vX.Y.Z at the
# commit that wrote CHANGELOG.md's "## vX.Y.Z" heading, v<next>-dev.<n>.g<commit> at any other
# (hack/version.sh says how). Computed once per make run. COMMIT is stamped next to it
# (`network-node-manager version`).
ifndef VERSION
VERSION     := $(shell ./hack/version.sh)
endif
COMMIT      ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
BIN         := $(CURDIR)/bin
AGENT       := $(BIN)/network-node-manager
# One build configuration for every Go build and test run here (the agent, the demo client, vet and
# the test binaries): pure Go, and no -trimpath on the local agent, so one build cache serves them all.
# With cgo on for the tests (the default when gcc is installed) and -trimpath on the agent, `go vet`
# and the tests compiled every dependency a second time after the demo had built it (issue #22).
# Release images keep -trimpath (hack/image.sh, Dockerfile).
export CGO_ENABLED := 0
GOFLAGS_RUN := -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)"
# Packages the project needs on a node or test machine, as "binary:debian-package".
SYSTEM_DEPS := iptables:iptables nft:nftables ip:iproute2 conntrack:conntrack
# What `make image` and `make release` need to build images without a Docker engine (qemu-user runs
# the arm64 image's binaries to check them; file prints their types).
IMAGE_DEPS  := buildah:buildah debootstrap:debootstrap qemu-aarch64-static:qemu-user-static file:file
TEST_FLAGS  ?= -count=1 -timeout 30m
# The longest test packages, named first: `go test -json` starts the packages' runs in the order they
# are listed (./... lists each package once), so these start as soon as their own test binaries are
# built instead of after every package before them in the alphabet, and the short ones fill the other
# slot. In the 2-core runs of issue #22 (2026-12-02, five runs after the nftables reads over
# netlink): e2e/vm 159-245 s, e2e 206-228 s, dataplane 62-94 s, backends/iptables 56-78 s;
# everything else under 40 s. The VM lane's guest is the part most
# sensitive to other load: with a busy loop beside a run, kube-proxy's first sync in the guest took
# 2m30s and the lane 9m30s of its 12-minute timeout.
# go test's default of one package slot per CPU (-p 2) stays: a running package holds its slot, so
# the other packages' test binaries are built after these two finish, but the CPUs are busy anyway.
# Tried and measured slower (one run each, from the state `make demo` leaves): -p 4 (597 s against
# 602 s; the VM lane's guest, starved, took 2m37s instead of 24s for kube-proxy's first sync and
# failed its reset reproduction); and, on top of two changes reverted since (guest GOGC=off, e2e
# tests in parallel), -p 3 with qemu at nice -10 (733 s: the VM lane, e2e and dataplane ran at once
# and each took 1.5-3x as long) and a second `go test -exec true` at nice 19 building the later
# packages' test binaries meanwhile (698 s; the VM lane took 383 s).
# After those, the packages whose tests mostly wait (pod deletions, control planes, stalls): started
# early in the tail they overlap with the CPU-bound links of the short packages instead of holding
# both slots at the end (in a warm run the last 40 s were staleudpconntrack and controlplane alone).
SLOW_TEST_PKGS := ./e2e ./dataplane ./backends/iptables ./fixes/staleudpconntrack ./deploy \
	./internal/testing/controlplane ./backends/nftables ./fixes/mssclamp
# Every fuzz target runs FUZZTIME long in `make fuzz`. `make test` runs each target's seed corpus (f.Add
# and testdata/fuzz/) as a plain test but does not fuzz: three seconds of fuzzing per target cost
# ~250 s in `make test`, nearly all of it building the instrumented test binaries.
FUZZTIME      ?= 2m

export NNM_BIN_DIR := $(BIN)

.PHONY: version image-lock release-tools helm helm-chart bench-datapath all build deps controlplane promtool image-deps test-image vm test test-vm test-unit fuzz demo bench lint fmt vet clean image release test-felix plan

all: build

include Makefile.controlplane.mk
include Makefile.cluster.mk
include Makefile.fleet.mk

## version: the version a build of this commit gets, the tag `make release` and `make image` build.
version:
	@echo $(VERSION)

## deps: install missing system packages (root on Debian); otherwise say what is missing.
deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
		bin=$${dep%%:*}; pkg=$${dep##*:}; \
		command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing:$$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
		else \
			echo "missing packages:$$missing (install them, or run as root on Debian)"; \
		fi; \
	fi

## build: the agent binary.
build:
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_RUN) -o $(AGENT) ./cmd/network-node-manager

## promtool: bin/promtool from Debian's prometheus package (version pinned in the script), for the
## alerting rule tests in deploy/.
promtool:
	./hack/fetch-promtool.sh

## vm: prepare the VM lane (qemu, busybox, the pinned Debian 6.1 kernel; see hack/vm/prepare.sh). Exit
## status 3 means "cannot here" (not root / no apt-get): the VM tests then skip, or fail under CI.
vm:
	@./hack/vm/prepare.sh || [ $$? = 3 ]

## test-vm: only the VM lane: kube-proxy in IPVS mode on a real 6.1 kernel under qemu (e2e/vm).
test-vm: build controlplane vm
	NNM_AGENT_BIN=$(AGENT) $(GO) test $(TEST_FLAGS) -v ./e2e/vm/

## test-felix: the Felix lane (e2e/felix, issue #20): the real Calico Felix (iptables-nft and nftables
## modes) beside the agent (both backends, both families) for NNM_FELIX_DURATION (default 60s). Needs
## Calico's and libbpf's git repositories (CALICO_GIT_DIR, LIBBPF_GIT_DIR, both required; hack/felix/build.sh),
## which builds Felix once into /var/cache/network-node-manager/felix/. Opt-in: not part of `make test`.
## The four lanes run side by side (-parallel 4; go test would run only GOMAXPROCS of them at once).
FELIX_TEST_FLAGS ?= -count=1 -timeout 90m -parallel 4
test-felix: deps build controlplane
	@env=$$(./hack/felix/build.sh) && \
		NNM_FELIX_ENV=$$env NNM_AGENT_BIN=$(AGENT) $(GO) test $(FELIX_TEST_FLAGS) -v ./e2e/felix/

## test: everything that proves the agent works. Kernel and end-to-end tests need root; with CI=true or
## NNM_REQUIRE_KERNEL=1 (.ci/run) a missing namespace, kernel feature or control plane fails them
## instead of skipping. Ends with the tests run/passed/failed/skipped and the seconds run per package. Fuzz seed corpora run
## as tests here; timed fuzzing is `make fuzz`.
## The VM lane (e2e/vm: two guests under qemu, 7 minutes of the 2 CPUs) is not: it is `make test-vm`,
## which .ci/run runs after this (with it, `make test` took 12m39s on 2 cores; the limit is 10).
## go vet runs inside go test (-vet=all: every analyzer on every package, test files included), as a
## step of each package's build, so it no longer holds back the start of the longest packages.
## The raw `go test -json` stream is kept in bin/test-events.json (timings per test and package).
test: deps build controlplane promtool helm
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	@set -o pipefail; { rc=0; \
		NNM_AGENT_BIN=$(AGENT) $(GO) test -json -vet=all $(TEST_FLAGS) $(SLOW_TEST_PKGS) $$($(GO) list ./... | grep -v '/e2e/vm$$') || rc=1; \
		if [ -f examples/go.mod ]; then (cd examples && NNM_AGENT_BIN=$(AGENT) $(GO) test -json -vet=all $(TEST_FLAGS) ./...) || rc=1; fi; \
		exit $$rc; } | tee $(BIN)/test-events.json | $(GO) run ./hack/testsummary

## fuzz: every fuzz target (func Fuzz* in *_test.go) for FUZZTIME each; a crasher is saved under the
## package's testdata/fuzz/ and fails the run.
fuzz:
	./hack/fuzz.sh $(FUZZTIME)

## test-unit: the tests that need neither root nor the control plane.
test-unit:
	$(GO) test -count=1 -short ./...

## plan: print the rules for examples/services.yaml (both backends), touching nothing.
plan: build
	$(AGENT) plan --services examples/services.yaml --config examples/config.yaml

## demo: start a local control plane and the agent in a "node" network namespace, create the example
## Services and show what the agent did. DEMO_ONCE=1 prints and exits.
demo: deps build controlplane
	./hack/demo.sh

## bench: scale benchmarks against the real control plane (see BENCHMARKS.md).
bench: deps build controlplane
	./hack/bench.sh

## bench-datapath: what the fix's rules cost each new connection on the node (BENCHMARKS.md, datapath
## section): a client, node and server namespace, the rules loaded by the real backends. Needs root.
## Writes bin/bench-datapath.md; BENCH_DATAPATH_ARGS="-write" also updates BENCHMARKS.md and its plot.
bench-datapath: deps
	$(GO) run ./bench/datapath $(BENCH_DATAPATH_ARGS)

## bench-fleet: what K agents starting at once cost the API server, beside kube-proxy's watches and a
## plain LIST, and a kube-apiserver restart under them (BENCHMARKS.md, Fleet). Needs root and the
## control plane (make controlplane); 10-20 min on 2 cores. Writes bin/bench-fleet.md;
## BENCH_FLEET_ARGS replaces the sizes (go run ./bench -h lists the -fleet flags).
.PHONY: bench-fleet
BENCH_FLEET_ARGS ?= -fleet 50,200 -fleet-kinds agent,list -fleet-restart 50 -fleet-outage 50 -fleet-conditions 500
bench-fleet: controlplane
	$(GO) run ./bench -out bin/bench-fleet.md $(BENCH_FLEET_ARGS)

## bench-kube-proxy: the real kube-proxy (bin/kube-proxy, nftables and iptables modes) beside the agent
## in one node namespace against one kube-apiserver: for each Service change (ingress IP set, endpoint
## moved, Service deleted) the time from the API write to each one's rule in the kernel, p50/p99
## (BENCHMARKS.md, Beside kube-proxy). Needs root; about 7 minutes per mode at 1,000 Services on 2 busy
## cores (changes are spaced 2.2 s apart so neither side's rate limit holds one back). Writes bin/bench-kube-proxy.md;
## BENCH_KUBE_PROXY_ARGS replaces the sizes and counts (go run ./bench -h).
.PHONY: bench-kube-proxy
BENCH_KUBE_PROXY_ARGS ?= -n 1000,10000 -changes 50
bench-kube-proxy: deps build controlplane
	BENCH_OUT=bin/bench-kube-proxy.md ./hack/bench.sh -kube-proxy nftables,iptables $(BENCH_KUBE_PROXY_ARGS)

lint: vet fmt
vet:
	$(GO) vet ./...
fmt:
	gofmt -l -w $$(git ls-files '*.go')

## image: the container image network-node-manager:$(VERSION) and :latest for this machine's
## architecture in buildah's local storage, without a Docker engine (hack/image.sh: debootstrap
## bookworm + iptables + nftables, pinned by hack/image/, as the Dockerfile).
image: image-deps
	VERSION=$(VERSION) COMMIT=$(COMMIT) ./hack/image.sh

## image-lock: write hack/image/bookworm-<arch>.lock, the base's pinned packages, from what the Debian
## archive serves now (after a point or security release: review the change, then commit it).
image-lock: image-deps
	for arch in $(or $(ARCHES),amd64 arm64); do ARCH=$$arch IMAGE_LOCK=1 ./hack/image.sh || exit 1; done

## release: the release bundle of this commit in bin/release/$(VERSION)/ (hack/release.sh): the
## image for linux/amd64 and linux/arm64 with its cosign signature and SBOM attestations, the SBOMs,
## install.yaml and uninstall.yaml pinned by digest, the Helm chart, cosign.pub, SHA256SUMS and its
## signature. $(VERSION) is vX.Y.Z only at the commit that wrote that CHANGELOG.md heading
## (`make -s version`). ARCHES=amd64 for one architecture; COSIGN_KEY for a release's key. Slow
## (debootstrap per architecture the first time): not in make test.
release: image-deps release-tools
	VERSION=$(VERSION) COMMIT=$(COMMIT) ./hack/release.sh

## release-tools: cosign, helm, the OCI registry and syft, each built from its pinned module
## (tools/cosign, tools/helm, tools/registry, tools/sbom) into bin/ (hack/build-release-tools.sh).
release-tools:
	./hack/build-release-tools.sh

## helm: bin/helm only (make test renders the chart with it).
helm:
	./hack/build-release-tools.sh helm

## helm-chart: write deploy/helm/network-node-manager from deploy/'s kustomizations (the chart is
## generated: edit deploy/, then run this; make test fails while they differ).
helm-chart:
	$(GO) run ./hack/manifests/cmd/manifests chart

## test-image: build the image and run it as deploy/base's DaemonSet would (read-only root, the
## manifest's capabilities and mounts, in a node network namespace, against the local API server).
test-image: image controlplane
	NNM_TEST_IMAGE=1 $(GO) test -count=1 -run TestImageRunsAsTheDaemonSet -v ./deploy/

image-deps:
	@$(MAKE) --no-print-directory deps SYSTEM_DEPS="$(IMAGE_DEPS)"

clean:
	rm -rf $(BIN)
