# The lanes that prove the agent where fleets run (issue #60), beside the cluster lane
# (Makefile.cluster.mk). Included by the Makefile.
#
#   make test-kube-versions   the agent beside kube-proxy of every supported Kubernetes release

.PHONY: kube-proxies test-kube-versions

## kube-proxies: bin/kube-proxy-<release> for every older supported release (tools/kube-proxy-v1.*,
## hack/build-kube-proxies.sh); the project's own pin is bin/kube-proxy (make controlplane).
kube-proxies:
	./hack/build-kube-proxies.sh

# The tests that run beside a real kube-proxy: e2e (iptables and nftables mode: detection, the
# coexistence of the rule sets through kube-proxy's full syncs and restarts, --proxy-mode overrides,
# the live follow of iptables → nftables, diagnose), dataplane (kubernetes#74839 beside both modes)
# and the VM lane (IPVS mode on kernel 6.1: kubernetes#75262 and #74839, both backends, the
# KubeProxyIPVS gate from v1.37, the live follow of IPVS → nftables).
# Each word is quoted for the shell's for loop (the patterns hold parentheses).
KUBE_VERSION_TESTS := './e2e=^(TestKubeProxy|TestAgentFollowsKubeProxy|TestDiagnoseBesideKubeProxy)$$' \
	'./dataplane=^TestConnectionResetBesideKubeProxy$$' './e2e/vm=^TestKubeProxyIPVSInVM$$'
# Which releases: "older" (default: make test runs the pin's, bin/kube-proxy) or "all".
NNM_KUBE_VERSIONS ?= older

## test-kube-versions: KUBE_VERSION_TESTS beside the kube-proxy of each supported release other than
## the pin (NNM_KUBE_VERSIONS=all: the pin's too), one release after the other; prints each run's
## time and a summary line. Fails (never skips) when a part cannot start.
test-kube-versions: deps build controlplane vm kube-proxies
	@start=$$(date +%s); rc=0; summary=""; \
	while read -r release bin; do \
		[ "$(NNM_KUBE_VERSIONS)" = all ] || [ "$$bin" != "$(BIN)/kube-proxy" ] || continue; \
		for t in $(KUBE_VERSION_TESTS); do \
			pkg=$${t%%=*}; run=$${t#*=}; s=$$(date +%s); r=0; \
			NNM_KUBE_PROXY_BIN=$$bin NNM_REQUIRE_KERNEL=1 NNM_AGENT_BIN=$(AGENT) $(GO) test $(TEST_FLAGS) -v -run "$$run" $$pkg || { r=$$?; rc=1; }; \
			summary="$$summary\n  kube-proxy $$release $$pkg -run '$$run': exit $$r, $$(( $$(date +%s) - s )) s"; \
		done; \
	done < <(./hack/build-kube-proxies.sh --list); \
	printf "make test-kube-versions:$$summary\n"; \
	echo "make test-kube-versions: took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
