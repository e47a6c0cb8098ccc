#!/usr/bin/env bash
# make bench: scale benchmarks of the agent against a real local control plane (see BENCHMARKS.md).
# Needs root (network namespaces), bin/network-node-manager (make build) and the control-plane
# binaries (make controlplane). Extra arguments go to the benchmark, e.g.
#   ./hack/bench.sh -n 1000 -backends nftables
#   BENCH_ARGS="-idle 30s" make bench
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "bench: needs root (it creates network namespaces and runs the agent in them)" >&2
	exit 1
fi
out="${BENCH_OUT:-bin/bench-results.md}"
# shellcheck disable=SC2086
exec go run ./bench -out "$out" ${BENCH_ARGS:-} "$@"
