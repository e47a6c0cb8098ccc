#!/usr/bin/env bash
# make demo: a local control plane, a "node" network namespace and the agent in it, the Services of
# examples/services.yaml, and what the agent programmed. Runs until Ctrl-C, then removes everything
# it created. `make demo` builds bin/network-node-manager, bin/etcd and bin/kube-apiserver first.
#
#   DEMO_ONCE=1           print and exit (non-interactive)
#   DEMO_BACKEND=nftables use the nftables backend (default iptables)
#   DEMO_NETNS=name       name of the node network namespace (default nnm-demo)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ "$(id -u)" != 0 ]; then
	echo "make demo needs root: it creates network namespaces and programs netfilter rules inside them" >&2
	echo "(the host's own rules, links and sysctls are not touched). Try: sudo make demo" >&2
	exit 1
fi

export NNM_BIN_DIR="${NNM_BIN_DIR:-$ROOT/bin}"
export NNM_AGENT_BIN="${NNM_AGENT_BIN:-$NNM_BIN_DIR/network-node-manager}"
for b in "$NNM_AGENT_BIN" "$NNM_BIN_DIR/etcd" "$NNM_BIN_DIR/kube-apiserver"; do
	if [ ! -x "$b" ]; then
		echo "missing $b: run \`make demo\` (it builds everything), or \`make build controlplane\`" >&2
		exit 1
	fi
done

# The demo driver is a small Go program (there is no kubectl here); build it next to the other binaries
# and exec it so that Ctrl-C reaches it and it can clean up.
CGO_ENABLED=0 go build -o "$NNM_BIN_DIR/nnm-demo" ./hack/demo
exec "$NNM_BIN_DIR/nnm-demo"
